"""Who owns a sandbox, and whether that owner is still alive.

Every sandbox records its owner: host name, pid and the process's start time (so a recycled pid
is not mistaken for the owner). A RUN or EVAL process that dies (SIGKILL, OOM, a lost machine)
leaves its sandboxes behind; anything that finds a sandbox whose owner on this host is dead may
reap it. Owners on other hosts cannot be checked from here: they are reaped by age only.

bwrap sandboxes keep their lease as `lease.json` in their directory under the sandbox root;
docker sandboxes carry the same fields as container labels.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rollstream.sandbox.settings import ROOT_ENV

__all__ = ["ROOT_ENV", "Lease", "Owner", "UidPool", "read_lease", "sandbox_root", "write_lease"]

LEASE_FILE = "lease.json"


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks after boot), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return int(stat.rpartition(")")[2].split()[19])


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start: int

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _start_ticks(pid) or 0)

    def alive(self) -> bool | None:
        """True / False for an owner on this host; None when it is on another host."""
        if self.host != socket.gethostname():
            return None
        return _start_ticks(self.pid) == self.start

    def label(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"

    @classmethod
    def parse(cls, label: str) -> Owner:
        host, pid, start = label.rsplit(":", 2)
        return cls(host, int(pid), int(start))


@dataclass
class Lease:
    id: str
    backend: str
    owner: str  # Owner.label()
    created_at: float = field(default_factory=time.time)
    labels: dict[str, str] = field(default_factory=dict)
    uid: int | None = None  # bwrap as root: the uid the sandbox runs as
    cgroups: list[str] = field(default_factory=list)  # bwrap: its control groups

    def owner_alive(self) -> bool | None:
        try:
            return Owner.parse(self.owner).alive()
        except ValueError:
            return False  # unreadable owner: nobody can be relying on it

    def abandoned(self, older_than_s: float | None = None) -> bool:
        """Reapable: its owner on this host is dead, or (any host) it is older than the bound."""
        if older_than_s is not None and time.time() - self.created_at > older_than_s:
            return True
        return self.owner_alive() is False


def sandbox_root(configured: str = "") -> Path:
    """Where bwrap sandboxes live: the configured folder (SandboxSettings.root), else a
    per-user temp folder."""
    root = Path(configured) if configured else (
        Path(tempfile.gettempdir()) / f"rollstream-sandboxes-{os.getuid()}")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def write_lease(directory: Path, lease: Lease) -> None:
    tmp = directory / (LEASE_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(lease)))
    tmp.replace(directory / LEASE_FILE)  # a reader never sees half a lease


def read_lease(directory: Path) -> Lease | None:
    try:
        return Lease(**json.loads((directory / LEASE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


class UidPool:
    """Distinct uids for concurrent sandboxes of a root owner, so one sandbox's process limit
    (counted per uid by the kernel) is not eaten by another's fork bomb. A uid is claimed by
    creating a link named after it (atomic), pointing at the sandbox id. Links are removed
    only under a lock on the pool, after checking whom they point at: a release or a sweep
    must never remove a link another sandbox has just made with the same uid."""

    def __init__(self, root: Path, first: int, count: int) -> None:
        self.dir = root / ".uids"
        self.dir.mkdir(exist_ok=True)
        self._lock_path = root / ".uids.lock"
        self.first, self.count = first, count

    def claim(self, sandbox_id: str) -> int:
        # Start from a hash of the id, then probe: cheap and rarely more than one try.
        start = int.from_bytes(sandbox_id.encode()[-6:], "big") % self.count
        for i in range(self.count):
            uid = self.first + (start + i) % self.count
            try:
                os.symlink(sandbox_id, self.dir / str(uid))
            except FileExistsError:
                continue
            return uid
        raise RuntimeError(f"all {self.count} sandbox uids are in use")

    def release(self, uid: int, sandbox_id: str) -> None:
        """Free `uid` if `sandbox_id` still holds it (a sweep may have freed it already)."""
        link = self.dir / str(uid)
        with self._locked():
            if _link_target(link) == sandbox_id:
                link.unlink()

    def release_orphans(self) -> None:
        """Free the uids whose sandbox directory is gone (an owner that died between removing
        the one and releasing the other). A sandbox makes its directory before it claims a
        uid, so a link whose directory is missing under the lock is an orphan."""
        with self._locked():
            for link in self.dir.iterdir():
                sandbox_id = _link_target(link)
                if sandbox_id is not None and not (self.dir.parent / sandbox_id).exists():
                    link.unlink()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # flock: released by the kernel if the holder dies, so a killed owner blocks no one.
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _link_target(link: Path) -> str | None:
    try:
        return os.readlink(link)
    except FileNotFoundError:
        return None
