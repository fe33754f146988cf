"""bubblewrap sandboxes: a private workspace directory and a fresh set of namespaces per command.

Every `exec` is one `bwrap` run: new pid, network, ipc and uts namespaces (no network at all,
not even a route), a read-only view of the system (/usr, a few /etc files, the project's Python),
the episode's workspace at /testbed, its private /tmp and /dev/shm as the only writable places,
all three on one size-capped tmpfs (the disk quota). Limits are
rlimits set inside the sandbox by prlimit: address space (memory), processes, file size, open
files. When the command ends or times out, bwrap's pid 1 dies and the kernel kills every process
left in the namespace: nothing outlives a command, and nothing outlives the owning process
(--die-with-parent).

Run as root, bwrap keeps no user namespace and the command drops to a uid of its own (a
different one per live sandbox): a root process is exempt from the process limit, and distinct
uids keep one sandbox's fork bomb from using up another's limit. Run as another user, bwrap
makes a user namespace, whose process count the kernel keeps per sandbox.

The workspace lives under the sandbox root (see leases.py), so a sandbox is just a directory
with a lease: cheap to create (no image), and swept when its owner is gone. Its writable part
(`disk`) is a tmpfs of `disk_mb`: as root mounted on the host; as another user mounted inside a
user and mount namespace held by a small process (the holder) that every command enters
(nsenter) before bwrap starts, and that exits when the sandbox or its owner goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from rollstream.sandbox import cgroups, seccomp
from rollstream.sandbox.base import (
    HARNESS_TIMEOUT_S,
    INODES_PER_MB,
    Backend,
    Limits,
    Sandbox,
    SandboxError,
    SandboxSpec,
    tar_files,
)
from rollstream.sandbox.capture import HeadTail
from rollstream.sandbox.leases import Lease, Owner, UidPool, read_lease, sandbox_root, write_lease
from rollstream.sandbox.settings import UIDS_ENV

log = logging.getLogger(__name__)

MARKER = "ROLLSTREAM_SANDBOX_DIR"  # set in every sandboxed process: finds leftovers
COMMAND_MARKER = "ROLLSTREAM_SANDBOX_COMMAND"  # one per command: finds all of it to kill
DEFAULT_UIDS = (1_000_000, 1_065_535)
REAP_INTERVAL_S = 30.0
KILL_GRACE_S = 30.0  # from killing a command to its output pipe closing (a busy host is slow)
# Read-only system files a shell, git and Python need; secrets (shadow) are not among them.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime",
             "passwd", "group", "nsswitch.conf", "gitconfig", "mime.types")
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def python_paths() -> list[str]:
    """Folders that hold the project's Python (the virtualenv and the interpreter it is based
    on), so code in the sandbox runs with the same Python and packages (pytest) as the host."""
    found: list[str] = []
    for path in (sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)):
        path = os.path.realpath(path)
        if not os.access(path, os.R_OK | os.X_OK):
            continue  # out of this owner's reach (e.g. under /root): bwrap could not bind it
        if not any(path == p or path.startswith(p + "/") for p in ("/usr", *found)):
            found.append(path)
    return found


def _parents(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


DISK = "disk"  # under a sandbox's directory: everything the sandbox can write, size-capped
WRITABLE = ("workspace", "tmp", "shm")  # on the disk: /testbed, /tmp, /dev/shm
# The holder of a non-root owner's disk: a user and mount namespace of its own with the tmpfs
# mounted (mount(8) refuses a non-root caller, hence the system call), then a shell that waits
# for its stdin, a pipe the sandbox holds open, to close: on destroy, or when the owner dies.
HOLDER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(rc, what):
    if rc != 0:
        raise OSError(ctypes.get_errno(), what)
disk, options = sys.argv[1], sys.argv[2]
uid, gid = os.geteuid(), os.getegid()
check(libc.unshare(0x10000000 | 0x00020000), "unshare")  # CLONE_NEWUSER | CLONE_NEWNS
for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                   ("gid_map", f"{gid} {gid} 1")):
    with open(f"/proc/self/{name}", "w") as f:
        f.write(text)
check(libc.mount(b"none", b"/", None, 16384 | 262144, None), "private")  # MS_REC | MS_PRIVATE
check(libc.mount(b"rollstream-sandbox", disk.encode(), b"tmpfs", 2 | 4, options.encode()),
      "mount tmpfs")  # MS_NOSUID | MS_NODEV
for sub in sys.argv[3:]:
    os.mkdir(os.path.join(disk, sub))
print("ready", flush=True)
os.execv("/bin/sh", ["sh", "-c", "read _"])
"""
HOLDER_START_S = 30.0


def _mount_args(disk: Path, workdir: str) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    args += ["--perms", "0755", "--dir", "/etc"]  # bwrap would make it 0700
    for name in ETC_FILES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    # The private /tmp first: a project checked out under /tmp (CI clones) must stay visible,
    # so its Python is bound on top of it, not hidden by it.
    args += ["--bind", str(disk / "tmp"), "/tmp"]
    made: set[str] = set()
    for path in python_paths():
        # bwrap creates missing parents as 0700; the sandbox uid must be able to pass them.
        for parent in _parents(path):
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", path, path]
    # /dev/shm on the disk too, and the rest of /dev read-only: no tmpfs of bwrap's own (half
    # the host's memory, uncapped) for the sandbox to fill.
    args += ["--dev", "/dev", "--bind", str(disk / "shm"), "/dev/shm", "--remount-ro", "/dev",
             "--proc", "/proc",
             "--bind", str(disk / "workspace"), workdir,
             "--remount-ro", "/"]  # the rest of the tree: nothing else is writable
    return args


def sandbox_env(directory: Path) -> dict[str, str]:
    """The whole environment of a sandbox, bwrap's own pid 1 included: nothing is inherited
    from the owner (its tokens would be readable in /proc/1/environ and end up in trajectories).
    """
    bin_dir = str(Path(sys.prefix) / "bin")
    return {
        "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/tmp",
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ in the workspace's diff
        "PYTHONUNBUFFERED": "1",
        MARKER: str(directory),
    }


def uid_range(text: str) -> tuple[int, int]:
    """The uids of a root owner's sandboxes: `FIRST-LAST` (SandboxSettings.uids), "" for the
    default range."""
    if not text:
        return DEFAULT_UIDS
    try:
        first, last = (int(x) for x in text.split("-"))
    except ValueError:
        raise SandboxError(
            f"{UIDS_ENV}={text!r}: expected FIRST-LAST, e.g. 1000000-1065535") from None
    return first, last


def available() -> str | None:
    """None when bwrap sandboxes can run here, else the reason they cannot."""
    for tool in ("bwrap", "prlimit", *(("setpriv",) if os.geteuid() == 0 else ())):
        if shutil.which(tool) is None:
            return (f"{tool} is not installed (bubblewrap sandboxes need bwrap, prlimit and, "
                    "as root, setpriv; `make deps` installs bubblewrap)")
    return None


def sandbox_processes() -> dict[int, str]:
    """Live processes of any bwrap sandbox on this host, bwrap's own included: pid -> the
    sandbox's directory (from the marker in their environment)."""
    return _marked(MARKER)


def _marked(name: str) -> dict[int, str]:
    """Live processes whose environment sets `name`: pid -> its value."""
    found: dict[int, str] = {}
    needle = name.encode() + b"="
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            data = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        for value in data.split(b"\0"):
            if value.startswith(needle):
                found[int(entry.name)] = value[len(needle):].decode(errors="replace")
                break
    return found


def _kill_command(token: str) -> None:
    """SIGKILL every process of one command, bwrap's own pid 1 among them (which ends the
    whole pid namespace). bwrap's pid 1 dies with bwrap only once it has set its parent-death
    signal: a command killed while still starting would otherwise live on, unwatched."""
    for pid, value in _marked(COMMAND_MARKER).items():
        if value == token:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _memfd(data: bytes) -> int:
    """An inheritable file descriptor reading `data` from its start."""
    fd = os.memfd_create("bwrap-args", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class BwrapSandbox(Sandbox):
    backend = "bwrap"

    def __init__(self, sandbox_id: str, spec: SandboxSpec, directory: Path,
                 uid: int | None, on_destroy: BwrapBackend,
                 group: cgroups.SandboxCgroup | None = None,
                 holder: subprocess.Popen | None = None) -> None:
        super().__init__(sandbox_id, spec)
        self.group = group
        self.holder = holder
        self.directory = directory
        self.uid = uid
        self._backend = on_destroy
        self._env = sandbox_env(directory)
        self._options = self._bwrap_options()
        self._command = self._limits_command()

    def _bwrap_options(self) -> list[str]:
        argv = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session",
                "--hostname", "sandbox"]
        if self.uid is None:
            argv += ["--unshare-user", "--disable-userns"]
        argv += _mount_args(self.directory / DISK, self.spec.workdir)
        return argv + ["--json-status-fd", "{status_fd}", "--chdir", "{cwd}"]

    def _limits_command(self) -> list[str]:
        """The per-process limits, and as root the drop to the sandbox's own uid."""
        limits = self.spec.limits
        argv = []
        if self.uid is not None:
            argv += ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
                     "--no-new-privs", "--"]
        mb = 1 << 20
        return argv + ["prlimit", f"--as={limits.memory_mb * mb}",
                       f"--nproc={limits.max_processes}", f"--fsize={limits.file_size_mb * mb}",
                       f"--nofile={limits.open_files}", "--core=0", "--"]

    async def _run(self, argv: list[str], timeout_s: float, stdin: bytes | None,
                   capture: HeadTail, cwd: str) -> tuple[int, bool]:
        if not self.directory.is_dir():
            raise SandboxError(f"sandbox {self.id}: its directory {self.directory} is gone")
        status_r, status_w = os.pipe()
        options = [a.replace("{status_fd}", str(status_w)).replace("{cwd}", cwd)
                   for a in self._options]
        # The options (host paths among them) go through a file descriptor, so the sandbox's
        # pid 1, which is bwrap, shows no host path in /proc/1/cmdline.
        filter_fd = seccomp.filter_fd()
        if filter_fd is not None:
            options += ["--seccomp", str(filter_fd)]
        args_fd = _memfd(b"\0".join(a.encode() for a in options) + b"\0")
        fds = (status_w, args_fd) if filter_fd is None else (status_w, args_fd, filter_fd)
        token = uuid.uuid4().hex
        try:
            proc = await asyncio.create_subprocess_exec(
                *(self.group.join_prefix() if self.group else ()),
                # Into the holder's namespaces, where the disk is mounted (no privilege kept:
                # bwrap makes its own user namespace inside).
                *(("nsenter", f"--target={self.holder.pid}", "--user", "--mount",
                   "--preserve-credentials", "--") if self.holder else ()),
                "bwrap", "--args", str(args_fd), "--", *self._command, *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else
                asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, pass_fds=fds,
                env={**self._env, COMMAND_MARKER: token})
        except OSError as exc:
            os.close(status_r)
            raise SandboxError(f"cannot start bwrap: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        reader = asyncio.ensure_future(self._communicate(proc, stdin, capture))
        timed_out = False
        try:
            # shield: on timeout the reader keeps draining, or the killed command's last
            # writes would fill the pipe and its end would never be seen.
            await asyncio.wait_for(asyncio.shield(reader), timeout_s)
        except TimeoutError:
            timed_out = True
        finally:
            try:
                await self._end(proc, reader, token)
            except SandboxError:
                os.close(status_r)  # what holds its other end may never close it
                raise
            status = await asyncio.to_thread(_read_all, status_r)
        if not timed_out and b'"child-pid"' not in status:
            raise SandboxError(f"sandbox {self.id} failed to start: "
                               f"{capture.value().decode(errors='replace').strip()}")
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        return _exit_code(status, code), timed_out

    async def _end(self, proc: asyncio.subprocess.Process, reader: asyncio.Future,
                   token: str) -> None:
        """Kill what still runs and wait, boundedly, for the output pipe to close."""
        if not reader.done():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.to_thread(_kill_command, token)
        try:
            await asyncio.wait_for(reader, KILL_GRACE_S)
        except TimeoutError:
            # Every process of the command was killed, so this is the kernel wedged.
            transport = getattr(proc, "_transport", None)
            if transport is not None:
                transport.close()
            raise SandboxError(f"sandbox {self.id}: its command's output was still open "
                               f"{KILL_GRACE_S:.0f} s after it was killed") from None

    @staticmethod
    async def _communicate(proc: asyncio.subprocess.Process, stdin: bytes | None,
                           capture: HeadTail) -> None:
        assert proc.stdout is not None
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            with contextlib.suppress(ConnectionError):  # the command need not read it all
                await proc.stdin.drain()
            proc.stdin.close()
        while chunk := await proc.stdout.read(1 << 16):
            capture.feed(chunk)
        await proc.wait()

    async def write_files(self, files: Mapping[str, bytes]) -> None:
        result = await self.exec(["tar", "-x", "-C", "/", "--no-same-owner", "-f", "-"],
                                 stdin=tar_files(files), timeout_s=HARNESS_TIMEOUT_S)
        if not result.ok:
            raise OSError(f"cannot write {', '.join(files)}: {result.text.strip()}")

    async def destroy(self) -> None:
        if self._closing():
            try:
                await asyncio.to_thread(self._backend.remove, self.id)
            except SandboxError as exc:
                # The episode is over either way; its lease stays for `sandbox sweep`.
                log.warning("%s", exc)
            finally:
                if self.holder is not None:
                    await asyncio.to_thread(_release, self.holder)
                self._destroyed()


def _release(holder: subprocess.Popen) -> None:
    """End a disk's holder (its tmpfs goes with its mount namespace) and reap it."""
    for pipe in (holder.stdin, holder.stdout, holder.stderr):
        if pipe is not None:
            pipe.close()
    holder.kill()
    holder.wait()


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _exit_code(status: bytes, fallback: int) -> int:
    """The command's exit code from bwrap's JSON status lines (bwrap's own code otherwise)."""
    for line in status.splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if "exit-code" in doc:
                return int(doc["exit-code"])
    return fallback


_disk_warned = False


def _tmpfs_options(limits: Limits) -> str:
    return f"size={limits.disk_mb}m,nr_inodes={limits.disk_mb * INODES_PER_MB},mode=0711"


def _no_disk_quota(reason: str) -> None:
    """Where no tmpfs can be had, the sandbox has no disk quota: one warning says so."""
    global _disk_warned
    if not _disk_warned:
        _disk_warned = True
        log.warning("cannot mount a tmpfs for sandbox files (%s): no disk quota per sandbox",
                    reason)


def _mount_disk(disk: Path, limits: Limits) -> bool:
    """As root: a size-capped tmpfs on the host holding everything the sandbox can write (the
    disk quota). Its pages count in the sandbox's memory group, as its processes write them."""
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"{_tmpfs_options(limits)},nosuid,nodev",
                           "rollstream-sandbox", str(disk)], capture_output=True)
    if done.returncode != 0:
        _no_disk_quota(done.stderr.decode(errors="replace").strip())
    return done.returncode == 0


def _hold_disk(disk: Path, limits: Limits, env: dict[str, str]) -> subprocess.Popen | None:
    """As another user: the disk's holder (see HOLDER), started and ready, or None (with the
    warning) where user namespaces or nsenter are not to be had."""
    if shutil.which("nsenter") is None:
        _no_disk_quota("nsenter is not installed")
        return None
    # This very interpreter, by its magic link: its path may run through folders closed to
    # the owner (a virtualenv of root's), which /proc/self/exe does not.
    holder = subprocess.Popen(
        ["/proc/self/exe", "-I", "-S", "-c", HOLDER, str(disk), _tmpfs_options(limits),
         *WRITABLE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, cwd="/")
    assert holder.stdout is not None and holder.stderr is not None
    ready, _, _ = select.select([holder.stdout], [], [], HOLDER_START_S)
    if ready and holder.stdout.readline() == b"ready\n":
        return holder
    holder.kill()
    reason = holder.communicate()[1].decode(errors="replace").strip()
    _no_disk_quota(reason.splitlines()[-1] if reason else "its holder did not start")
    return None


def delete_tree(path: Path) -> None:
    """Delete a sandbox's directory whatever its command left there: trees too deep for
    Python's recursive rmtree, directories made unreadable (chmod 000), millions of files.
    coreutils walk a tree iteratively. Raises SandboxError when something stays."""
    if not os.path.lexists(path):
        return
    for disk in (path / DISK, path):  # a sandbox's disk (earlier versions mounted it on path)
        if os.path.ismount(disk):  # its whole tree goes with the mount
            subprocess.run(["umount", "--lazy", str(disk)], capture_output=True, check=False)
    if os.geteuid() != 0:  # root passes permission bits; the owner must first restore its own
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], capture_output=True,
                       check=False)
    done = subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)],
                          capture_output=True, check=False)
    if os.path.lexists(path):
        reason = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise SandboxError(f"cannot delete {path}: {' / '.join(reason) or 'it is still there'}")


class BwrapBackend(Backend):
    name = "bwrap"

    def __init__(self, root: Path | None = None, uids: str = "") -> None:
        """`root`: where its sandboxes live (None: the per-user temp folder); `uids`: the uid
        range of a root owner's sandboxes (SandboxSettings.uids)."""
        self.root = root or sandbox_root()
        self.uid_text = uids
        self.as_root = os.geteuid() == 0
        self._uids: UidPool | None = None
        self._last_reap = 0.0

    @property
    def uids(self) -> UidPool:
        if self._uids is None:
            first, last = uid_range(self.uid_text)
            self._uids = UidPool(self.root, first, last - first + 1)
        return self._uids

    async def create(self, spec: SandboxSpec) -> BwrapSandbox:
        if spec.image is not None:
            raise SandboxError(f"bwrap sandboxes cannot run the image {spec.image!r}; "
                               "use the docker backend (ROLLSTREAM_SANDBOX=docker)")
        reason = available()
        if reason is not None:
            raise SandboxError(reason)
        if time.monotonic() - self._last_reap > REAP_INTERVAL_S:
            self._last_reap = time.monotonic()
            try:
                await asyncio.to_thread(self.reap)
            except OSError as exc:  # housekeeping, never the episode's failure
                log.warning("sandbox sweep before a create: %s", exc)
        return await asyncio.to_thread(self._create, spec)

    def _create(self, spec: SandboxSpec) -> BwrapSandbox:
        sandbox_id = f"bw-{uuid.uuid4().hex[:16]}"
        directory = self.root / sandbox_id
        lease = Lease(sandbox_id, self.name, Owner.current().label(), labels=dict(spec.labels))
        disk = directory / DISK
        holder = None
        try:
            directory.mkdir(mode=0o711)
            disk.mkdir(mode=0o711)
            write_lease(directory, lease)  # before the uid or the holder: each has its lease
            if self.as_root:
                _mount_disk(disk, spec.limits)
            else:
                holder = _hold_disk(disk, spec.limits, sandbox_env(directory))
            if holder is None:  # else the holder made them, on its tmpfs
                for sub in WRITABLE:
                    (disk / sub).mkdir()
            if self.as_root:
                lease.uid = self.uids.claim(sandbox_id)
                write_lease(directory, lease)
                for sub in WRITABLE:
                    os.chown(disk / sub, lease.uid, lease.uid)
            group = cgroups.create(sandbox_id, spec.limits.memory_mb, spec.limits.max_processes)
            if group is not None:
                lease.cgroups = [str(g) for g in group.groups]
                write_lease(directory, lease)
        except (OSError, RuntimeError) as exc:
            self.remove(sandbox_id)
            if holder is not None:
                _release(holder)
            raise SandboxError(f"cannot create sandbox under {self.root}: {exc}") from exc
        return BwrapSandbox(sandbox_id, spec, directory, lease.uid, self, group, holder)

    def leases(self) -> list[Lease]:
        found = []
        for directory in sorted(self.root.glob("bw-*")):
            lease = read_lease(directory)
            # A directory without a readable lease is one being created or being removed.
            if lease is not None:
                found.append(lease)
        return found

    def remove(self, sandbox_id: str) -> None:
        """Kill whatever still runs in the sandbox, then delete its directory and uid."""
        directory = self.root / sandbox_id
        lease = read_lease(directory)
        for pid, owner in sandbox_processes().items():
            if owner == str(directory):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, 9)
        if lease is not None and lease.cgroups:
            cgroups.SandboxCgroup([Path(g) for g in lease.cgroups]).kill_and_remove()
        delete_tree(directory)
        if lease is not None and lease.uid is not None:
            self.uids.release(lease.uid, sandbox_id)

    def reap(self, older_than_s: float | None = None, everything: bool = False) -> list[Lease]:
        reaped = super().reap(older_than_s, everything)
        if self.as_root and (self.root / ".uids").is_dir():
            self.uids.release_orphans()
        return reaped
