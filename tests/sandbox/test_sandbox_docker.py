"""Docker sandboxes. With an engine: the same isolation checks as the bwrap suite, on a real
container. Without one (skipped, with the reason), what the backend asks the engine for is
still checked against a recording stand-in for the docker SDK client; the logic above the
backend (scaffold, evaluation) is the same for both and runs on bwrap in tests/envs/test_swe*.py."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from rollstream.sandbox import Limits, SandboxError, Sandboxes, SandboxSettings, SandboxSpec
from rollstream.sandbox.backends import unavailable
from rollstream.sandbox.docker import DEFAULT_IMAGE, KEEPER, LABEL, OWNER_LABEL, DockerBackend
from rollstream.sandbox.docker import available as docker_available

NO_DOCKER = docker_available()
IMAGE = os.environ.get("ROLLSTREAM_TEST_DOCKER_IMAGE", DEFAULT_IMAGE)


class _Container:
    def __init__(self, labels: dict[str, str]) -> None:
        self.id = "c0ffee"
        self.attrs = {"Image": "sha256:1mg"}
        self.labels = labels
        self.removed = False
        self.archives: list[tuple[str, bytes]] = []

    def put_archive(self, path: str, data: bytes) -> bool:
        self.archives.append((path, data))
        return True

    def remove(self, force: bool, v: bool) -> None:
        self.removed = force and v



class _Api:
    def __init__(self) -> None:
        self.execs: list[list[str]] = []
        self.probes: list[str] = []
        self.probes_removed = 0

    def create_container(self, image: str, command: list[str], **kwargs: Any) -> dict:
        self.probes.append(image)
        return {"Id": "pr0be"}

    def get_archive(self, container_id: str, path: str) -> Any:
        import docker.errors

        raise docker.errors.NotFound(f"{path}: no such file")  # an image without /testbed

    def remove_container(self, container_id: str, force: bool) -> None:
        self.probes_removed += 1

    def exec_create(self, container_id: str, argv: list[str], **kwargs: Any) -> dict:
        self.execs.append(argv)
        return {"Id": "e1"}

    def exec_start(self, exec_id: str, stream: bool) -> Any:
        # What the SDK hands back: a stream over an HTTP response whose headers are read;
        # "hello\n" as one stdout frame of the engine's multiplexed format.
        reader = io.BufferedReader(io.BytesIO(b"\x01\x00\x00\x00\x00\x00\x00\x06hello\n"))
        response = SimpleNamespace(raw=SimpleNamespace(_fp=SimpleNamespace(fp=reader)),
                                   close=reader.close)
        return SimpleNamespace(_response=response)

    def _disable_socket_timeout(self, sock: Any) -> None:
        pass

    def exec_inspect(self, exec_id: str) -> dict:
        return {"ExitCode": 0}


class _Containers:
    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.created: list[_Container] = []

    def run(self, image: str, command: list[str], **kwargs: Any) -> _Container:
        self.runs.append({"image": image, "command": command, **kwargs})
        self.created.append(_Container(kwargs["labels"]))
        return self.created[-1]

    def list(self, all: bool, filters: dict[str, str]) -> list[_Container]:
        return [c for c in self.created if not c.removed]


class _Client:
    def __init__(self) -> None:
        self.containers = _Containers()
        self.api = _Api()


def test_container_is_locked_down_and_labelled_and_exec_has_a_timeout() -> None:
    client = _Client()
    backend = DockerBackend(client)
    limits = Limits(memory_mb=1024, max_processes=100, cpus=2.0, timeout_s=7)

    async def body():
        sandbox = await backend.create(SandboxSpec(image="img:1", limits=limits,
                                                   labels={"task": "t1"}))
        result = await sandbox.exec("echo hello")
        await sandbox.write_file("/testbed/a.py", b"x = 1\n")
        with pytest.raises(OSError, match="Read-only"):
            await sandbox.write_file("/etc/a.py", b"x = 1\n")
        await sandbox.destroy()
        again = await backend.create(SandboxSpec(image="img:1", limits=limits))
        await again.destroy()
        return sandbox, result

    sandbox, result = asyncio.run(body())
    run = client.containers.runs[0]
    assert run["image"] == "img:1" and run["command"] == KEEPER
    assert run["network_disabled"] and run["network_mode"] == "none"
    assert run["mem_limit"] == run["memswap_limit"] == "1024m"
    assert run["nano_cpus"] == 2_000_000_000 and run["pids_limit"] == 100
    assert run["cap_drop"] == ["ALL"] and run["security_opt"] == ["no-new-privileges"]
    # Only the workspace and /tmp are writable: tmpfs volumes of the disk quota.
    assert run["read_only"] and run["shm_size"] == "256m" and run["environment"] == {
        "HOME": "/tmp"}
    assert [(m["Target"], m["VolumeOptions"]["DriverConfig"]["Options"]["o"].split(",")[0])
            for m in run["mounts"]] == [("/testbed", "size=1024m"), ("/tmp", "size=256m")]
    # The image was probed for a /testbed of its own once (it has none), and the probe removed.
    assert client.api.probes == ["img:1"] and client.api.probes_removed == 1
    assert run["labels"][LABEL] == sandbox.id and run["labels"]["rollstream.label.task"] == "t1"
    assert run["labels"][OWNER_LABEL].split(":")[1] == str(os.getpid())
    assert client.api.execs[0][:2] == ["bash", "-c"] and "kill -9 -1" in client.api.execs[0][2]
    assert client.api.execs[0][3:] == ["7", "bash", "-c", "echo hello"]
    assert result.text == "hello\n" and result.ok
    container = client.containers.created[0]
    assert container.archives[0][0] == "/testbed" and container.removed
    assert backend.leases() == []


def test_a_task_with_an_image_needs_docker() -> None:
    sandboxes = Sandboxes(SandboxSettings(backend="auto"))
    if unavailable("docker") is None:
        assert sandboxes.backend_name("img:1") == "docker"
    else:
        with pytest.raises(SandboxError, match="no sandbox backend for image 'img:1'.*docker"):
            sandboxes.backend_name("img:1")


def test_an_unknown_backend_setting_is_named() -> None:
    with pytest.raises(SandboxError, match="ROLLSTREAM_SANDBOX='podman'; choose one of auto"):
        Sandboxes(SandboxSettings(backend="podman")).backend_name(None)


def test_a_task_without_an_image_gets_the_image_handed_to_the_backend() -> None:
    client = _Client()
    backend = DockerBackend(client, image="site/base:1")

    async def body():
        await (await backend.create(SandboxSpec())).destroy()
    asyncio.run(body())
    assert client.containers.runs[0]["image"] == "site/base:1"


@pytest.mark.skipif(NO_DOCKER is not None, reason=f"{NO_DOCKER}")
def test_real_container_is_isolated_limited_and_removed() -> None:
    backend = DockerBackend()

    async def body():
        sandbox = await backend.create(SandboxSpec(
            image=IMAGE, limits=Limits(memory_mb=256, max_processes=64, output_bytes=4096)))
        try:
            net = await sandbox.exec("python -c 'import socket; "
                                     "print([n for _, n in socket.if_nameindex()])'")
            assert net.text.strip() == "['lo']"
            slow = await sandbox.exec("sleep 300 & sleep 300", timeout_s=1)
            assert slow.timed_out
            loud = await sandbox.exec("head -c 100000000 /dev/zero | tr '\\0' x")
            assert loud.omitted_bytes > 99_000_000
            await sandbox.write_file("/testbed/a.txt", b"kept")
            assert await sandbox.read_file("/testbed/a.txt", 100) == b"kept"
        finally:
            await sandbox.destroy()
        assert sandbox.id not in {lease.id for lease in backend.leases()}

    asyncio.run(body())


@pytest.mark.skipif(NO_DOCKER is not None, reason=f"{NO_DOCKER}")
def test_the_workspace_holds_the_images_own_and_is_capped() -> None:
    import io

    import docker

    client = docker.from_env()
    dockerfile = (f"FROM {IMAGE}\nRUN mkdir -p /testbed/pkg && echo from-image > "
                  "/testbed/pkg/a.txt && chmod 700 /testbed/pkg\n").encode()
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile), rm=True,
                                   labels={"rollstream.test": "workspace"})
    backend = DockerBackend()

    async def body():
        sandbox = await backend.create(SandboxSpec(image=image.id, limits=Limits(disk_mb=16)))
        try:
            return await sandbox.exec("cat pkg/a.txt; stat -c %a pkg; df -k --output=size . "
                                      "| tail -1; head -c 20000000 /dev/zero 2>/dev/null > b "
                                      "|| echo full")
        finally:
            await sandbox.destroy()

    try:
        result = asyncio.run(body())
    finally:
        client.images.remove(image.id, force=True)
    assert result.text.split() == ["from-image", "700", "16384", "full"], result.text


# As in the bwrap suite: still printing at the timeout, deaf to SIGTERM, or moved out of the
# command's process group (which `timeout` alone would not reach) with the output held open.
RUNAWAY = {
    "yes": "yes",
    "urandom": "base64 /dev/urandom",
    "ignores_sigterm": "trap '' TERM; while :; do echo still here; sleep 0.01; done",
    "setsid_holds_output": "setsid yes & sleep 300",
}


@pytest.mark.skipif(NO_DOCKER is not None, reason=f"{NO_DOCKER}")
def test_a_fast_commands_output_is_not_lost_when_its_reader_is_slow() -> None:
    """A busy thread that holds the interpreter for long stretches delays each exec's read of
    the engine's reply until the command has finished: its output then arrives in the same
    read as the reply's headers (what a loaded machine did to `git rev-parse HEAD`)."""
    backend = DockerBackend()
    done = threading.Event()

    def hold_the_interpreter() -> None:
        while not done.is_set():
            pass

    async def body() -> list[str]:
        sandbox = await backend.create(SandboxSpec(image=IMAGE))
        interval = sys.getswitchinterval()
        hog = threading.Thread(target=hold_the_interpreter, daemon=True)
        sys.setswitchinterval(0.2)
        hog.start()
        try:
            return [(await sandbox.exec(f"echo {i}")).text for i in range(4)]
        finally:
            done.set()
            hog.join()
            sys.setswitchinterval(interval)
            await sandbox.destroy()

    outputs = asyncio.run(body())
    assert outputs == [f"{i}\n" for i in range(4)]


@pytest.mark.skipif(NO_DOCKER is not None, reason=f"{NO_DOCKER}")
def test_a_runaway_command_in_a_container_returns_and_is_killed() -> None:
    backend = DockerBackend()

    async def body():
        sandbox = await backend.create(SandboxSpec(image=IMAGE))
        try:
            for name, command in RUNAWAY.items():
                started = asyncio.get_running_loop().time()
                result = await sandbox.exec(command, timeout_s=2, output_bytes=1 << 20)
                elapsed = asyncio.get_running_loop().time() - started
                # Generous for a busy machine; a hang would never return.
                assert elapsed < 2 + 15, (name, elapsed)
                assert result.timed_out and not result.ok, name
                left = await sandbox.exec("ps -eo pid=,args= | grep -v -e 'ps -eo' -e grep")
                pids = {line.split(None, 1)[0] for line in left.text.strip().splitlines()}
                assert len(pids) <= 3, (name, left.text)  # pid 1, its sleep, this bash
            assert (await sandbox.exec("echo alive")).text == "alive\n"
        finally:
            await sandbox.destroy()

    asyncio.run(body())


@pytest.mark.skipif(NO_DOCKER is not None, reason=f"{NO_DOCKER}")
def test_escape_attempts_in_a_container_fail(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path) -> None:
    monkeypatch.setenv("OWNER_SECRET", "hunter2-token")  # the owner's environment
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host-only")
    backend = DockerBackend()

    async def body():
        sandbox = await backend.create(SandboxSpec(image=IMAGE))
        try:
            return await sandbox.exec(
                f"cat {secret} 2>&1; ls /var/run/docker.sock 2>&1; env; "
                "cat /proc/1/environ | tr '\\0' '\\n'; "
                "unshare -U true 2>&1 && echo NESTED-USERNS; "
                "python -c 'import socket; socket.create_connection((\"10.0.0.1\", 80), 2)' "
                "2>&1 | tail -1; "
                "grep CapEff /proc/self/status; kill -9 -1; echo after-kill"), \
                await sandbox.exec("echo alive")
        finally:
            await sandbox.destroy()

    result, after = asyncio.run(body())
    text = result.text
    assert after.text == "alive\n"  # killing all it could left its own container up
    assert "host-only" not in text and "No such file" in text
    assert "hunter2-token" not in text and "OWNER_SECRET" not in text
    assert "NESTED-USERNS" not in text
    assert "Network is unreachable" in text
    assert "CapEff:\t0000000000000000" in text  # every capability dropped
    assert "after-kill" in text
