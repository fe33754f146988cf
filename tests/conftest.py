"""Shared fixtures: one Kafka broker per test session, fresh topics per test.

Broker, in order: KAFKA_BOOTSTRAP_SERVERS; else a Kafka container when a Docker engine answers
and holds the Kafka image (registries may be unreachable); else the bundled local broker
(rollstream.broker.local), reused if it is running already. With xdist workers (`-n`) the
controller chooses it once and every worker uses that one.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from rollstream.broker import local
from rollstream.broker.secure import Material
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import Settings, Topics, load
from tests.docs.blocks import summary_line
from tests.helpers import vllm_server
from tests.helpers.k8s_cluster import SET_UP
from tests.helpers.secure_helpers import secured_broker

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
SHARED_BOOTSTRAP_ENV = "ROLLSTREAM_TEST_SHARED_BOOTSTRAP"  # the xdist controller's broker
# The same Kafka as the bundled broker (rollstream/broker/pom.xml).
KAFKA_IMAGE = "apache/kafka:4.1.2"
BROKER_NICE = -10  # the session broker's priority (_favour)
DURATIONS = Path(__file__).with_name("durations.json")


def _kafka_image_here() -> bool:
    """A Docker engine answers and already holds the Kafka image. Registries may be out of
    reach, so an engine without the image (there only for sandboxes) does not count."""
    try:
        import docker

        docker.from_env().images.get(KAFKA_IMAGE)
    except Exception:  # no engine, no socket, no permission, no image: all mean "no"
        return False
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from rollstream.sandbox.docker import available

    reason = available()
    if reason is not None:  # one line, so a skipped Docker path is never silent
        terminalreporter.write_line(f"docker sandbox tests skipped: {reason} "
                                    "(`make deps` as root starts an engine)")
    reason = vllm_server.impossible()
    if reason is not None:
        terminalreporter.write_line(f"real-vLLM tests skipped: {reason}")
    line = summary_line(terminalreporter.stats)
    if line is not None:
        terminalreporter.write_line(line)
    stats = terminalreporter.stats
    for report in stats.get("passed", []) + stats.get("failed", []):
        for name, value in getattr(report, "user_properties", []):
            if name == SET_UP:  # tests/deploy/test_k8s.py: the cluster's, measured
                terminalreporter.write_line(f"{name}: {value}")


def _kafka_container() -> tuple[DockerContainer, str]:
    """Start an apache/kafka container configured like the bundled broker."""
    from testcontainers.core.container import DockerContainer

    # testcontainers' KafkaContainer scripts the confluentinc image only; apache/kafka is set up
    # with its KAFKA_* environment variables. The advertised address must be known before the
    # container starts, so bind a host port chosen here.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, port)
    host = container.get_docker_client().host()
    env = {
        "node.id": "1",
        "process.roles": "broker,controller",
        "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": "1@localhost:9093",
        **local.BROKER_SETTINGS,
    }
    for key, value in env.items():
        # The image's mapping: "_" -> "__", "-" -> "___", "." -> "_".
        var = key.replace("_", "__").replace("-", "___").replace(".", "_").upper()
        container.with_env(f"KAFKA_{var}", value)
    container.start()
    bootstrap = f"{host}:{port}"
    local.wait_ready(bootstrap, timeout=120)
    return container, bootstrap


def _favour(pid: int | None) -> None:
    """Raise the session broker's CPU share. It stands in for a cluster on machines of its own,
    but here it shares 2 cores with every worker's processes (a load of about 30): starved for
    tens of seconds in a CI run, it answered nothing and failed 34 tests. Its autogroup (it runs
    in a session of its own) and its threads get a higher weight; where the kernel refuses (not
    root), nothing changes."""
    if pid is None:
        return
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{BROKER_NICE}\n")
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(tid), BROKER_NICE)


@contextmanager
def _session_broker() -> Iterator[str]:
    """The broker of a test session, in the order of this module's docstring."""
    if os.environ.get(BOOTSTRAP_ENV):
        yield os.environ[BOOTSTRAP_ENV]
    elif _kafka_image_here():
        container, address = _kafka_container()
        try:
            yield address
        finally:
            container.stop()
    else:
        # Stop it at the end only if this session started it: a running broker is someone's.
        started_here = not local.is_running()
        address = local.start()
        _favour(local.status()["pid"])
        try:
            yield address
        finally:
            if started_here:
                local.stop()


def pytest_configure(config: pytest.Config) -> None:
    """With workers (`-n`), one broker for all of them, chosen here in the controller before
    they are spawned (they inherit its address) and let go when the run ends."""
    if not getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        return
    stack = ExitStack()
    config.add_cleanup(stack.close)
    # Not KAFKA_BOOTSTRAP_SERVERS: the processes tests start must not inherit it.
    os.environ[SHARED_BOOTSTRAP_ENV] = stack.enter_context(_session_broker())
    # The real vLLM server: a directory now, the server when a worker first needs it.
    shared_vllm = tempfile.mkdtemp(prefix="rollstream-vllm-")
    os.environ[vllm_server.SHARED_DIR_ENV] = shared_vllm
    stack.callback(vllm_server.stop_shared, Path(shared_vllm))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The heaviest test files first. Workers take whole files (`--dist loadfile`) in this
    order (`--no-loadscope-reorder`), so a long file starts at once instead of running alone at
    the end. The weights (durations.json) are each file's measured seconds, only an order, from
    one calm run of the whole suite; a file not there goes after them, in the order collected.
    Refresh them from a run's `--durations=0` when a file's share changes a lot."""
    weights = json.loads(DURATIONS.read_text())
    items.sort(key=lambda item: -weights.get(item.nodeid.split("::", 1)[0], 0))


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    if os.environ.get(SHARED_BOOTSTRAP_ENV):
        yield os.environ[SHARED_BOOTSTRAP_ENV]
    else:
        with _session_broker() as address:
            yield address


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vllm_server.RealVllm]:
    """vLLM's CPU build serving the tiny local model (tests/helpers/vllm_server.py), one per
    session."""
    reason = vllm_server.impossible()
    if reason is not None:
        pytest.skip(reason)
    if os.environ.get(vllm_server.SHARED_DIR_ENV):
        yield vllm_server.shared(Path(os.environ[vllm_server.SHARED_DIR_ENV]))
    else:
        with vllm_server.own(tmp_path_factory.mktemp("vllm")) as server:
            yield server


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Material]]:
    """A secured broker (SASL_SSL, SCRAM, ACLs enforced) of the module's own, in a home of
    its own: its address and its material (CA, admin credential)."""
    with secured_broker(tmp_path_factory.mktemp("home")) as found:
        yield found


@pytest.fixture
def topics(bootstrap: str) -> Iterator[Topics]:
    """The topic graph under a fresh prefix (kept if ROLLSTREAM_TEST_KEEP_TOPICS=1)."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, prefix, partitions=4)
    yield Topics(prefix)
    if os.environ.get("ROLLSTREAM_TEST_KEEP_TOPICS") != "1":
        delete_topics(bootstrap, prefix, whole_namespace=True)  # stats', replays' topics too


@pytest.fixture
def settings(bootstrap: str, topics: Topics) -> Settings:
    return load(bootstrap_servers=bootstrap, prefix=topics.prefix, partitions=4)
