"""The sandbox interface: one isolated workspace per episode, whatever runs it.

A sandbox holds a repository at `workdir` (/testbed, as in SWE-bench images) and runs commands
in it with no network, bounded memory, processes, file sizes, output and time. Backends:
`bwrap` (bubblewrap; no Docker engine needed) and `docker` (a container from the task's image).
Everything above this interface (the SWE scaffold, its evaluation) is backend-agnostic.

Errors: a command that fails, times out or runs out of memory is a normal `ExecResult` (the
agent's doing, shown to it); `SandboxError` means the sandbox itself failed (could not start,
died, engine gone): an infrastructure failure, never the agent's.
"""

from __future__ import annotations

import io
import logging
import tarfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rollstream.sandbox.capture import HeadTail
from rollstream.sandbox.leases import Lease
from rollstream.telemetry import metrics

log = logging.getLogger(__name__)

WORKDIR = "/testbed"
# Files and folders a size-capped tmpfs may hold per MB: one per 4 KiB, so empty files (which
# take no space) cannot use up kernel memory without bound.
INODES_PER_MB = 256


class SandboxError(RuntimeError):
    """The sandbox could not be created or stopped working: an infra failure."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox; the README's table says which hold for the whole
    sandbox and which per process, under each backend."""

    memory_mb: int = 2048
    max_processes: int = 256
    cpus: float = 1.0  # docker only: bwrap has no CPU share, its commands are bounded by time
    file_size_mb: int = 512
    disk_mb: int = 1024  # what the sandbox may write: its workspace and /tmp (see the README)
    open_files: int = 1024
    output_bytes: int = 1 << 20  # per command, head + tail
    timeout_s: float = 30.0  # per command, unless the call says otherwise


# The harness's own commands (reading a file, writing files, git) are quick, but on a busy host
# each waits its turn; the bound is for what an agent may leave in their way (a FIFO, say).
HARNESS_TIMEOUT_S = 120.0

@dataclass(frozen=True)
class SandboxSpec:
    """What to start: an `image` (docker) with the repository at `workdir`, or an empty
    workspace (bwrap, or docker with the default image) for the caller to fill."""

    image: str | None = None
    workdir: str = WORKDIR
    limits: Limits = field(default_factory=Limits)
    labels: Mapping[str, str] = field(default_factory=dict)  # e.g. task and episode ids


@dataclass
class ExecResult:
    exit_code: int  # 128 + N when killed by signal N (as a shell reports it)
    output: bytes  # stdout and stderr interleaved, head + tail when over the output limit
    timed_out: bool = False
    omitted_bytes: int = 0
    duration_s: float = 0.0

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", errors="replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def shell_argv(command: str | Sequence[str]) -> list[str]:
    """A command string runs under bash (pipes, &&, redirections); a list is exec'd as is."""
    return ["bash", "-c", command] if isinstance(command, str) else list(command)


def tar_files(files: Mapping[str, bytes], mode: int = 0o644, root: str = "/") -> bytes:
    """An uncompressed tar of `files` keyed by absolute path (each under `root`), members
    relative to `root`."""
    buf = io.BytesIO()
    prefix = root.rstrip("/") + "/"
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.removeprefix(prefix))
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Sandbox(ABC):
    """A live sandbox. Not shared between processes: another process that needs the episode's
    workspace creates its own sandbox and rebuilds the workspace (see rollstream.envs.swe)."""

    backend: str

    def __init__(self, sandbox_id: str, spec: SandboxSpec) -> None:
        self.id = sandbox_id
        self.spec = spec
        self.closed = False
        self._when_destroyed: list[Callable[[], None]] = []
        metrics.track_sandbox(self)

    def when_destroyed(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the sandbox is destroyed (e.g. to free its job's quota slot)."""
        self._when_destroyed.append(callback)

    def _destroyed(self) -> None:
        """What a backend's `destroy` calls last, whether or not the removal worked."""
        callbacks, self._when_destroyed = self._when_destroyed, []
        for callback in callbacks:
            callback()

    @property
    def workdir(self) -> str:
        return self.spec.workdir

    def _closing(self) -> bool:
        """Mark the sandbox closed as its destruction starts (its lifetime counts for its job's
        sandbox-seconds); False where it already was: destroying is idempotent."""
        if self.closed:
            return False
        self.closed = True
        metrics.sandbox_destroyed(self)
        return True

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
        output_bytes: int | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run `command` in the sandbox (cwd: workdir); the whole process tree is killed when it
        ends or times out. Raises SandboxError only if the sandbox itself failed."""
        if self.closed:
            raise SandboxError(f"sandbox {self.id} was destroyed")
        limits = self.spec.limits
        capture = HeadTail(output_bytes or limits.output_bytes)
        started = time.perf_counter()
        code, timed_out = await self._run(
            shell_argv(command), limits.timeout_s if timeout_s is None else timeout_s, stdin,
            capture, cwd or self.workdir)
        return ExecResult(code, capture.value(), timed_out, capture.dropped,
                          time.perf_counter() - started)

    @abstractmethod
    async def _run(self, argv: list[str], timeout_s: float, stdin: bytes | None,
                   capture: HeadTail, cwd: str) -> tuple[int, bool]:
        """Run argv, feeding its output to `capture`; returns (exit code, timed out)."""

    @abstractmethod
    async def write_files(self, files: Mapping[str, bytes]) -> None:
        """Create or replace files (absolute paths; parents are created) inside the sandbox."""

    @abstractmethod
    async def destroy(self) -> None:
        """Stop everything and remove the sandbox; idempotent."""

    async def read_file(self, path: str, max_bytes: int) -> bytes:
        """The file's bytes, read inside the sandbox (so links cannot reach the host); raises
        FileNotFoundError / IsADirectoryError / ValueError (too large) with the reason."""
        # One exec: a status line (dir, missing or the size), then the content if it fits.
        script = (
            'if [ -d "$1" ]; then echo dir; elif [ ! -e "$1" ]; then echo missing; '
            'else n=$(wc -c < "$1") || exit 1; echo "$n"; '
            '[ "$n" -le "$2" ] && exec cat -- "$1"; fi'
        )
        result = await self.exec(["bash", "-c", script, "read_file", path, str(max_bytes)],
                                 timeout_s=HARNESS_TIMEOUT_S,
                                 output_bytes=max_bytes + 64)
        status, _, content = result.output.partition(b"\n")
        answer = status.decode(errors="replace").strip()
        if answer == "dir":
            raise IsADirectoryError(path)
        if answer == "missing":
            raise FileNotFoundError(path)
        if not answer.isdigit():
            raise OSError(f"cannot read {path}: {result.text.strip()}")
        if int(answer) > max_bytes:
            raise ValueError(f"{path} is {int(answer)} bytes, more than {max_bytes}")
        if result.exit_code != 0 or len(content) != int(answer):
            raise OSError(f"cannot read {path}: {content.decode(errors='replace').strip()}")
        return content

    async def write_file(self, path: str, data: bytes) -> None:
        await self.write_files({path: data})

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.destroy()


class Backend(ABC):
    """Creates sandboxes of one kind and finds them again (to list and sweep them)."""

    name: ClassVar[str]

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """A new, running sandbox; raises SandboxError when it cannot be had."""

    @abstractmethod
    def leases(self) -> list[Lease]:
        """Every sandbox of this kind that exists (this host's, or this engine's)."""

    @abstractmethod
    def remove(self, sandbox_id: str) -> None:
        """Kill and delete one sandbox, whoever owns it."""

    def reap(self, older_than_s: float | None = None, everything: bool = False) -> list[Lease]:
        """Remove sandboxes whose owner died (or older than the bound, or all); returns those
        removed (one that cannot be is logged and left for the next sweep)."""
        reaped = [lease for lease in self.leases()
                  if everything or lease.abandoned(older_than_s)]
        removed = []
        for lease in reaped:
            log.info("removing %s sandbox %s (owner %s)", self.name, lease.id, lease.owner)
            try:
                self.remove(lease.id)
            except SandboxError as exc:  # one broken sandbox must not stop the others
                log.warning("could not remove %s sandbox %s: %s", self.name, lease.id, exc)
                continue
            removed.append(lease)
        return removed
