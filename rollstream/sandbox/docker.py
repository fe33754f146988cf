"""Docker sandboxes: one container per episode from the task's image (SWE-bench style images
hold the repository at /testbed), removed when the episode is done.

The container's pid 1 is a bash loop (KEEPER) that the agent cannot kill from inside, with no
network, capped memory (swap included), CPU and pids, every capability dropped and
no-new-privileges. Its root file system is read-only: the workspace and /tmp are size-capped
tmpfs volumes (the disk quota; overlay2 on ext4 cannot cap a container's layer), the
workspace seeded with the image's own copy of it; /dev/shm is capped alike.

`docker exec` has no timeout, so each command runs under `timeout -s KILL`, and when it ends
(finished or timed out) every process in the container but pid 1 is killed: nothing a command
started (a setsid daemon, a fork bomb) outlives it, as under bwrap. Commands of one sandbox
therefore run one at a time. A host-side deadline on top catches a wedged engine (then the
sandbox is an infra failure). Output is streamed and capped as for bwrap. Labels record the
owner (see leases.py) so `rollstream sandbox sweep` can remove containers left by a process that
died.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rollstream.sandbox.base import (
    INODES_PER_MB,
    Backend,
    Sandbox,
    SandboxError,
    SandboxSpec,
    tar_files,
)
from rollstream.sandbox.capture import HeadTail
from rollstream.sandbox.leases import Lease, Owner
from rollstream.sandbox.settings import IMAGE_ENV

__all__ = ["DEFAULT_IMAGE", "IMAGE_ENV", "DockerBackend", "DockerSandbox", "available"]

# For tasks without an image of their own (the shipped snapshots): needs bash, git and pytest.
DEFAULT_IMAGE = "rollstream/base:bookworm"  # built by `make deps` from Debian packages
LABEL = "rollstream.sandbox"
OWNER_LABEL = "rollstream.owner"
CREATED_LABEL = "rollstream.created"
LABEL_PREFIX = "rollstream.label."
KILL_GRACE_S = 5.0  # past the timeout: `timeout` killed the command, its output is not closed
# The container's pid 1: the kernel ignores signals sent to it from inside, so `kill -9 -1`
# (the agent's, or ours after a timeout) leaves the container up; bash reaps orphans.
KEEPER = ["bash", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
# Runs every command: `kill -1` reaches every process but pid 1 and the shell sending it, so
# whatever the command left (moved out of its group, still forking) is gone when it returns.
RUNNER = 'timeout -s KILL "$0" "$@"; s=$?; kill -9 -1 2>/dev/null; exit $s'
TMP = "/tmp"
ENGINE_GRACE_S = 30.0  # after killing everything: the engine itself is stuck
# A frame of an exec's multiplexed output: stream (1 stdout, 2 stderr), 3 pad bytes, size.
FRAME_HEADER = struct.Struct(">B3xL")


def _errors() -> tuple[type[BaseException], ...]:
    import docker.errors

    return (docker.errors.DockerException, OSError)


def available() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:  # no SDK, no socket, no permission, engine down: all "no Docker"
        return f"no Docker engine reachable ({type(exc).__name__}: {exc})"
    return None


def _in_own_thread(fn: Callable[..., int], *args: Any) -> asyncio.Future[int]:
    """`fn(*args)` run at once in a new thread; its result as a future of the running loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()

    def settle(result: int | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(result)  # type: ignore[arg-type]
        else:
            future.set_exception(error)

    def target() -> None:
        result: int | None = None
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        else:
            error = None
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, daemon=True, name="docker-exec").start()
    return future


def _exec_output(api: Any, exec_id: str) -> Iterator[bytes]:
    """Start an exec and yield its output (stdout and stderr multiplexed, no tty), frame by
    frame, until the command and everything holding its output are gone.

    docker-py reads the frames from the raw socket, past the buffer in which the HTTP client
    read the response's headers; a fast command's output sent together with them lands in that
    buffer and is lost (seen on a loaded machine: `git rev-parse HEAD` printing nothing, exit
    0, in about 1 of 100 execs). So the frames are read here through that buffer."""
    response = api.exec_start(exec_id, stream=True)._response
    reader = response.raw._fp.fp  # http.client's buffered reader: the headers are read
    api._disable_socket_timeout(reader.raw)  # a silent command may run for many minutes
    try:
        while header := reader.read(FRAME_HEADER.size):
            if len(header) < FRAME_HEADER.size:
                raise OSError("the engine's output stream ended inside a frame header")
            _stream, size = FRAME_HEADER.unpack(header)
            yield reader.read(size)
    finally:
        response.close()


class DockerSandbox(Sandbox):
    backend = "docker"

    def __init__(self, sandbox_id: str, spec: SandboxSpec, client: Any, container: Any) -> None:
        super().__init__(sandbox_id, spec)
        self.client = client
        self.container = container
        # Each command ends by killing every process: a concurrent one would go with it.
        self._one_at_a_time = asyncio.Lock()

    async def _run(self, argv: list[str], timeout_s: float, stdin: bytes | None,
                   capture: HeadTail, cwd: str) -> tuple[int, bool]:
        async with self._one_at_a_time:
            return await self._run_alone(argv, timeout_s, stdin, capture, cwd)

    async def _run_alone(self, argv: list[str], timeout_s: float, stdin: bytes | None,
                         capture: HeadTail, cwd: str) -> tuple[int, bool]:
        if stdin is not None:  # docker-py has no plain stdin for exec: go through a file
            stdin_path = f"{TMP}/.rollstream-stdin-{uuid.uuid4().hex}"
            try:
                await self.write_files({stdin_path: stdin})
            except OSError as exc:  # the agent filled /tmp: the command fails, as its doing
                capture.feed(f"cannot pass the command its input: {exc}\n".encode())
                return 1, False
            argv = ["bash", "-c", 'f=$1; shift; "$@" < "$f"; s=$?; rm -f "$f"; exit $s',
                    "stdin", stdin_path, *argv]
        argv = ["bash", "-c", RUNNER, str(math.ceil(timeout_s)), *argv]
        started = time.perf_counter()
        # A thread of its own: in a shared pool, waiting for a free thread would count
        # against the command's deadline.
        command = _in_own_thread(self._exec_blocking, argv, cwd, capture)
        try:
            try:
                code = await asyncio.wait_for(asyncio.shield(command), timeout_s + KILL_GRACE_S)
            except TimeoutError:
                # RUNNER's own kill did not come (the engine is slow, or RUNNER was killed)
                # and something still holds the output open: kill everything from outside.
                await asyncio.to_thread(self._kill_all)
                code = await asyncio.wait_for(command, ENGINE_GRACE_S)
                return code, True
        except TimeoutError:
            await self.destroy()
            raise SandboxError(f"sandbox {self.id}: the engine did not end a command "
                               f"{ENGINE_GRACE_S:.0f} s after its timeout") from None
        except _errors() as exc:
            raise SandboxError(f"sandbox {self.id}: {type(exc).__name__}: {exc}") from exc
        # 137 is also an OOM kill; only a kill at the deadline is a timeout.
        return code, code == 137 and time.perf_counter() - started >= timeout_s - 0.05

    def _kill_all(self) -> None:
        """SIGKILL every process in the container but its pid 1 (KEEPER), which the kernel
        shields from signals sent inside the container."""
        try:
            self.container.exec_run(["kill", "-9", "-1"])
        except _errors() as exc:
            raise SandboxError(f"sandbox {self.id}: cannot kill its processes: {exc}") from exc

    def _exec_blocking(self, argv: list[str], cwd: str, capture: HeadTail) -> int:
        api = self.client.api
        exec_id = api.exec_create(self.container.id, argv, workdir=cwd, stdout=True,
                                  stderr=True, stdin=False, tty=False)["Id"]
        for chunk in _exec_output(api, exec_id):
            capture.feed(chunk)
        return int(api.exec_inspect(exec_id)["ExitCode"])

    async def write_files(self, files: Mapping[str, bytes]) -> None:
        # The engine writes into a volume only when asked for a path inside it: one archive
        # per writable volume, and the read-only rest refused as bwrap's tar would.
        by_volume: dict[str, dict[str, bytes]] = {}
        for path, data in files.items():
            volume = next((v for v in (self.workdir, TMP) if path.startswith(v + "/")), None)
            if volume is None:
                raise OSError(f"cannot write {path}: Read-only file system (only "
                              f"{self.workdir} and {TMP} are writable)")
            by_volume.setdefault(volume, {})[path] = data
        for volume, group in by_volume.items():
            try:
                ok = await asyncio.to_thread(self.container.put_archive, volume,
                                             tar_files(group, root=volume))
            except _errors() as exc:
                if "no space left on device" in str(exc).lower():  # the sandbox's disk is full
                    raise OSError(errno.ENOSPC, f"cannot write {', '.join(group)}: No space "
                                  "left on device") from exc
                raise SandboxError(f"sandbox {self.id}: cannot write files: {exc}") from exc
            if not ok:
                raise OSError(f"cannot write {', '.join(group)}")

    async def destroy(self) -> None:
        if self._closing():
            try:
                await asyncio.to_thread(DockerBackend.remove_container, self.container)
            finally:
                self._destroyed()


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, client: Any = None, image: str = "") -> None:
        """`image`: for tasks that name none (SandboxSettings.image; "": DEFAULT_IMAGE)."""
        self._client = client
        self.image = image or DEFAULT_IMAGE
        self._no_workdir: set[tuple[str, str]] = set()  # (image id, workdir): nothing to seed

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker

            try:
                self._client = docker.from_env()
            except docker.errors.DockerException as exc:
                raise SandboxError(f"no Docker engine reachable: {exc}") from exc
        return self._client

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        return await asyncio.to_thread(self._create, spec)

    def _create(self, spec: SandboxSpec) -> DockerSandbox:
        from docker.types import DriverConfig, Mount, Ulimit

        sandbox_id = f"dk-{uuid.uuid4().hex[:16]}"
        limits = spec.limits
        image = spec.image or self.image
        labels = {LABEL: sandbox_id, OWNER_LABEL: Owner.current().label(),
                  CREATED_LABEL: f"{time.time():.3f}",
                  **{LABEL_PREFIX + k: v for k, v in spec.labels.items()}}
        file_size = limits.file_size_mb << 20
        # tmpfs through the local volume driver, not a tmpfs mount: the engine's archive calls
        # (write_files, seeding) reach a volume but write under a tmpfs mount, unseen.
        # The engine cannot share one tmpfs between mount points: the workspace gets the
        # quota, /tmp and /dev/shm a quarter of it each (all of it memory of the container).
        scratch_mb = max(limits.disk_mb // 4, 1)

        def tmpfs(size_mb: int) -> DriverConfig:
            inodes = size_mb * INODES_PER_MB
            return DriverConfig("local", {"type": "tmpfs", "device": "tmpfs",
                                          "o": f"size={size_mb}m,nr_inodes={inodes},nosuid,nodev"})
        try:
            container = self.client.containers.run(
                image, KEEPER, detach=True, labels=labels, read_only=True,
                # Caches and configs written under HOME (pip, matplotlib, git) need a writable
                # one: /tmp, as under bwrap.
                environment={"HOME": TMP},
                mounts=[Mount(spec.workdir, None, type="volume",
                              driver_config=tmpfs(limits.disk_mb)),
                        Mount(TMP, None, type="volume", driver_config=tmpfs(scratch_mb))],
                network_disabled=True, network_mode="none",
                mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
                shm_size=f"{scratch_mb}m",
                nano_cpus=int(limits.cpus * 1e9), pids_limit=limits.max_processes,
                cap_drop=["ALL"], security_opt=["no-new-privileges"],
                ulimits=[Ulimit(name="fsize", soft=file_size, hard=file_size),
                         Ulimit(name="nofile", soft=limits.open_files, hard=limits.open_files)],
                working_dir=spec.workdir, name=f"rollstream-{sandbox_id}")
        except _errors() as exc:
            raise SandboxError(f"cannot start a container from {image!r}: {exc}") from exc
        try:
            self._seed(container, image, spec.workdir, labels)
        except _errors() as exc:
            self.remove(sandbox_id)
            raise SandboxError(f"cannot copy {spec.workdir} of {image!r} into its sandbox: "
                               f"{exc}") from exc
        return DockerSandbox(sandbox_id, spec, self.client, container)

    def _seed(self, container: Any, image: str, workdir: str, labels: dict[str, str]) -> None:
        """Fill the empty workspace volume with the image's own `workdir`, read from a
        container that is created but never started (the volume hides it in the sandbox)."""
        import docker.errors

        key = (container.attrs.get("Image", image), workdir)
        if key in self._no_workdir:
            return
        api = self.client.api
        probe = api.create_container(image, ["true"], network_disabled=True, labels=labels)
        try:
            try:
                stream, _ = api.get_archive(probe["Id"], f"{workdir}/.")
            except docker.errors.NotFound:
                self._no_workdir.add(key)
                return
            api.put_archive(container.id, workdir, stream)
        finally:
            api.remove_container(probe["Id"], force=True)

    def _containers(self) -> list[Any]:
        return self.client.containers.list(all=True, filters={"label": LABEL})

    def leases(self) -> list[Lease]:
        found = []
        for container in self._containers():
            labels = container.labels
            found.append(Lease(
                labels[LABEL], self.name, labels.get(OWNER_LABEL, ""),
                float(labels.get(CREATED_LABEL, "0") or 0),
                {k[len(LABEL_PREFIX):]: v for k, v in labels.items()
                 if k.startswith(LABEL_PREFIX)}))
        return found

    @staticmethod
    def remove_container(container: Any) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.NotFound):  # already gone: as wanted
            container.remove(force=True, v=True)  # v: its workspace and /tmp volumes too

    def remove(self, sandbox_id: str) -> None:
        try:
            for container in self.client.containers.list(
                    all=True, filters={"label": f"{LABEL}={sandbox_id}"}):
                self.remove_container(container)
        except _errors() as exc:  # a sweep logs it and goes on with the others
            raise SandboxError(f"cannot remove container of sandbox {sandbox_id}: {exc}") \
                from exc

