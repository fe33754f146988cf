"""The bundled single-node Apache Kafka 4.x broker (KRaft), run from Maven Central jars.

Nothing here needs Docker: the broker's jars are collected once with Maven from ``pom.xml`` next to
this file, then ``java`` runs ``kafka.Kafka`` detached, so the broker outlives the command that
started it and later commands (CLI, demo, tests) reuse it.

Everything lives under the home folder, ``$ROLLSTREAM_HOME`` (default: ``.rollstream`` in the
project root)::

    kafka/libs/          broker jars (+ .pom-sha256: which pom they were resolved from)
    kafka/data/          log dirs (topic data and the KRaft metadata log)
    kafka/broker.json    ports and cluster id, chosen at first start and kept
    kafka/server.properties, kafka/log4j2.properties, kafka/broker.log, kafka/broker.pid
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

from rollstream.broker import secure
from rollstream.config import Settings
from rollstream.contracts.wire import MAX_MESSAGE_BYTES

HOME_ENV = "ROLLSTREAM_HOME"
HEAP_ENV = "ROLLSTREAM_BROKER_HEAP"
JAVA_OPTS_ENV = "ROLLSTREAM_BROKER_JAVA_OPTS"  # more JVM options, after ours (the last wins)
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"
POM = Path(__file__).with_name("pom.xml")
HOST = "127.0.0.1"  # loopback only: a dev broker with no auth must not be reachable from outside

# Broker settings besides listeners and paths. Also used to configure a Kafka container the same way
# (tests/conftest.py), so both brokers behave alike.
BROKER_SETTINGS: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    # One node: internal topics can have one replica only, or groups and transactions never work.
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    # Fewer internal partitions than the defaults (50) make the first group / transaction on a fresh
    # broker much faster on a small machine; one node gains nothing from more.
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.num.partitions": "8",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    # Consumers join at once instead of waiting 3 s for more members (tests, demo).
    "group.initial.rebalance.delay.ms": "0",
    # Topics come from `rollstream topics create` with explicit configs; a typo must not make one.
    "auto.create.topics.enable": "false",
    # Multi-turn trajectories are large (token ids + logprobs + text); topics set their own caps.
    "message.max.bytes": str(MAX_MESSAGE_BYTES),
    # Stages may commit offsets with metadata (e.g. the episode-state checkpoint position).
    "offset.metadata.max.bytes": "65536",
    # The machine is small and shared with the stages and tests.
    "num.network.threads": "2",
    "num.io.threads": "4",
    "num.recovery.threads.per.data.dir": "1",
    "log.retention.hours": "168",
    # The log cleaner's key map is one array on the heap, allocated as the broker starts:
    # Kafka's 128 MiB took half a 256 MiB heap in one contiguous piece, and small brokers
    # died of OutOfMemoryError during start-up on a loaded machine. 24 bytes a key:
    # 32 MiB still maps 1.3 million keys in one cleaning pass.
    "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
}

LOG4J2_PROPERTIES = """\
# Kafka's own loggers at WARN, written to stdout, which the launcher redirects to broker.log.
status = warn
appender.out.type = Console
appender.out.name = STDOUT
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = STDOUT
# One INFO line per start/stop, so the log shows when the broker was up.
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
"""


class BrokerError(RuntimeError):
    """The bundled broker could not be set up, started or stopped."""


# --------------------------------------------------------------------------------------- paths


def project_root() -> Path:
    """The directory holding pyproject.toml above this package; the current directory otherwise."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file():
            return parent
    return Path.cwd()


def base_home() -> Path:
    env = os.environ.get(HOME_ENV)
    return Path(env).expanduser().resolve() if env else project_root() / ".rollstream"


# While set (`secured()`), this module and cluster.py manage the secured broker, which lives in
# a home of its own beside the plain one's: both can run at once.
_secure_home: Path | None = None


@contextlib.contextmanager
def secured() -> Iterator[secure.Material]:
    """Within: start, stop, status and the cluster act on the secured bundled broker
    (rollstream/broker/secure.py), whose home is `secure/` under the plain one's."""
    global _secure_home
    before = _secure_home
    _secure_home = base_home() / "secure"
    try:
        yield security() or secure.material(_secure_home / "tls")
    finally:
        _secure_home = before


def security() -> secure.Material | None:
    """The secured broker's certificates and credentials, within `secured()`; else None."""
    return secure.material(_secure_home / "tls") if _secure_home is not None else None


def home() -> Path:
    return _secure_home or base_home()


def kafka_dir() -> Path:
    return home() / "kafka"


def libs_dir() -> Path:
    return base_home() / "kafka" / "libs"  # one set of jars for every broker


@contextlib.contextmanager
def home_sharing_jars(folder: Path) -> Iterator[Path]:
    """Within: ROLLSTREAM_HOME is `folder` (for this process and the commands it runs), a home
    of its own whose broker runs on this home's jars (linked, not copied); the environment is
    restored after."""
    libs = resolve_jars()
    with mock.patch.dict(os.environ, {HOME_ENV: str(folder)}):
        libs_dir().parent.mkdir(parents=True, exist_ok=True)
        libs_dir().symlink_to(libs, target_is_directory=True)
        yield folder


def class_archive() -> Path:
    """The broker JVM's class-data archive (rollstream/broker/class_archive.py), beside the jars
    so that new jars remove it; not a jar, so the classpath's libs/* never picks it up."""
    return libs_dir().resolve() / ".broker-classes.jsa"


# The bundled broker is a development and test broker: it lives minutes, where the optimizing
# compiler (C2) costs more CPU than its code saves. On the client compiler alone a broker started
# on 1.9 s of CPU instead of 3.4 s, and a 2-minute load of topics, transactions and groups took
# 24 CPU-s instead of 35 (two cores). ROLLSTREAM_BROKER_JAVA_OPTS=-XX:TieredStopAtLevel=4 (the
# last option wins) gives a long-lived broker both compilers back.
JIT_OPTIONS = ["-XX:TieredStopAtLevel=1"]


def jvm_options() -> list[str]:
    """Options for every broker-side JVM: the client compiler only, and the class-data archive
    where one has been made."""
    archive = class_archive()
    return [*JIT_OPTIONS, *([f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else [])]


def admin_conf(bootstrap: str) -> dict[str, Any]:
    """The client configuration that reaches a bundled broker as its administrator."""
    material = security()
    return {"bootstrap.servers": bootstrap} if material is None \
        else material.admin_conf(bootstrap)


def listener_lines(node: dict[str, Any]) -> list[str]:
    """A node's listeners (its ports: port, controller_port, and the secured broker's
    mtls_port): plaintext on loopback, or the secured broker's."""
    material = security()
    if material is not None:
        return material.listener_lines(node, HOST)
    port, controller_port = node["port"], node["controller_port"]
    return [
        f"listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
    ]


def add_listener_ports(nodes: list[dict[str, Any]]) -> bool:
    """Give every node the ports its listeners need beyond port and controller_port (the
    secured broker's mutual-TLS one, which a home made before it lacks); True if any was
    added, so the caller saves them."""
    if security() is None:
        return False
    taken = {v for node in nodes for v in node.values() if isinstance(v, int)}
    added = False
    for node in (n for n in nodes if "mtls_port" not in n):
        port = _free_port()
        while port in taken:
            port = _free_port()
        node["mtls_port"] = port
        taken.add(port)
        added = True
    return added


def security_settings() -> dict[str, str]:
    material = security()
    return {} if material is None else material.broker_settings()


def format_args() -> list[str]:
    material = security()
    return [] if material is None else material.format_args()


def log_path() -> Path:
    return kafka_dir() / "broker.log"


def _pid_path() -> Path:
    return kafka_dir() / "broker.pid"


def _state_path() -> Path:
    return kafka_dir() / "broker.json"


def _config_path() -> Path:
    return kafka_dir() / "server.properties"


def _data_dir() -> Path:
    return kafka_dir() / "data"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialize start/stop/resolve across processes (parallel CLIs, test workers)."""
    kafka_dir().mkdir(parents=True, exist_ok=True)
    with open(kafka_dir() / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------------------- jars


def _pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def jars_ready() -> bool:
    """True when libs/ holds jars resolved from the current pom.xml."""
    marker = libs_dir() / ".pom-sha256"
    return marker.is_file() and marker.read_text().strip() == _pom_hash()


def resolve_jars(force: bool = False) -> Path:
    """Collect the broker's jars with Maven into libs/, unless already there for this pom."""
    with _locked():
        return _resolve_jars(force)


def _resolve_jars(force: bool) -> Path:
    libs = libs_dir()
    if not force and jars_ready():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(
            "the bundled Kafka broker needs Maven (`mvn`) once, to fetch its jars: install Maven "
            f"(and Java 17+), or set {BOOTSTRAP_ENV} to an existing broker"
        )
    # Resolve into a scratch folder and swap it in, so an interrupted download never looks complete.
    # Beside libs/, in the plain home: the secured broker (`secured()`) shares its jars, and on
    # a fresh home neither folder exists yet.
    scratch = libs.with_name("libs.partial")
    scratch.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(scratch, ignore_errors=True)
    cmd = [
        mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(POM),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={scratch}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not any(scratch.glob("kafka_*.jar")):
        shutil.rmtree(scratch, ignore_errors=True)
        output = (proc.stdout + proc.stderr).strip()[-3000:]
        raise BrokerError(f"Maven could not fetch the Kafka broker jars ({POM}):\n{output}")
    (scratch / ".pom-sha256").write_text(_pom_hash() + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    scratch.rename(libs)
    return libs


def kafka_version() -> str | None:
    """Version of the resolved broker jars (e.g. "4.1.2"), None before the first resolution."""
    for jar in libs_dir().glob("kafka_2.13-*.jar"):
        return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")
    return None


# -------------------------------------------------------------------------------------- process


def _alive(pid: int) -> bool:
    """Is pid a live (not zombie) process?"""
    with contextlib.suppress(ChildProcessError):
        # Reap it if it is our own child that exited, or it lingers as a zombie and looks alive.
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs (macOS): trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _is_our_broker(pid: int) -> bool:
    """Alive and really a Kafka broker (a stale pid file may name a recycled pid)."""
    if not _alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"kafka.Kafka" in cmdline


def _read_pid() -> int | None:
    try:
        return int(_pid_path().read_text().strip())
    except (OSError, ValueError):
        return None


def _running_pid() -> int | None:
    pid = _read_pid()
    return pid if pid is not None and _is_our_broker(pid) else None


def is_running() -> bool:
    """Is a broker started from this home running (it may still be starting up)?"""
    return _running_pid() is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # Kafka binds with SO_REUSEADDR too, so a TIME_WAIT left by the last run is no conflict.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _state() -> dict[str, Any]:
    """Ports and cluster id; chosen once, because the formatted KRaft log records the controller."""
    path = _state_path()
    if path.is_file():
        state = dict(json.loads(path.read_text()))
        if not add_listener_ports([state]):
            return state
    else:
        port = _free_port()
        controller_port = _free_port()
        while controller_port == port:
            controller_port = _free_port()
        # A Kafka cluster id is a UUID in URL-safe base64 without padding (22 characters).
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        state = {"port": port, "controller_port": controller_port, "cluster_id": cluster_id}
        add_listener_ports([state])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2) + "\n")
    return state


def _bootstrap_of(state: dict[str, Any], port: str = "port") -> str:
    """The address of one of the node's listeners (`port`: the key of its port)."""
    return f"{HOST}:{state[port]}"


def _write_config(state: dict[str, Any]) -> Path:
    cport = state["controller_port"]
    lines = [
        "# Written by rollstream.broker.local at every start; edit BROKER_SETTINGS there instead.",
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers={HOST}:{cport}",
        *listener_lines(state),
        f"log.dirs={_data_dir()}",
        *(f"{k}={v}" for k, v in {**BROKER_SETTINGS, **security_settings()}.items()),
    ]
    path = _config_path()
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)  # a secured broker's holds the admin's password
    return path


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError(
            f"the bundled Kafka broker needs Java 17+ (`java` not found): install a JDK, "
            f"or set {BOOTSTRAP_ENV} to an existing broker"
        )
    return java


def _classpath() -> str:
    # The JVM expands the wildcard itself. Resolved: a home that links to the shared jars gives
    # the same class path as the others, which the class-data archive is only valid for.
    return str(libs_dir().resolve() / "*")


def _format_storage(state: dict[str, Any], config: Path) -> None:
    format_storage(_data_dir(), state["cluster_id"], config, standalone=True)


def format_storage(data_dir: Path, cluster_id: str, config: Path, standalone: bool) -> None:
    """Format a node's log dir for KRaft (`standalone`: a one-node quorum; else the voters
    come from controller.quorum.voters in the config)."""
    if (data_dir / "meta.properties").is_file():
        return  # formatting again is a no-op (--ignore-formatted) but costs a JVM start
    cmd = [
        _java(), "-Xmx256m", *jvm_options(), "-cp", _classpath(), "kafka.tools.StorageTool",
        "format",
        *(["--standalone"] if standalone else []), f"--cluster-id={cluster_id}", "-c", str(config),
        "--ignore-formatted", *format_args(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).strip()[-3000:]
        raise BrokerError(f"formatting the broker's storage failed:\n{output}")


def log_tail(lines: int = 40) -> str:
    try:
        text = log_path().read_text(errors="replace")
    except OSError:
        return "(no broker log)"
    return "\n".join(text.splitlines()[-lines:]) or "(broker log is empty)"


# Popen handles of brokers started by this process: kept so they are not garbage collected while
# running (which warns) and so stop() can reap them.
_children: dict[int, subprocess.Popen[bytes]] = {}


def _launch(state: dict[str, Any], config: Path) -> int:
    return launch(config, kafka_dir(), log_path(), _pid_path())


def launch(config: Path, workdir: Path, log: Path, pid_file: Path) -> int:
    """Run a broker JVM detached with `config`; its output goes to `log`, its pid to pid_file."""
    if log.exists():
        log.replace(log.with_name(log.name + ".1"))  # keep the previous run's log for post-mortems
    (workdir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    # Kafka's own default heap (kafka-server-start.sh); the tests' many brokers take less.
    heap = os.environ.get(HEAP_ENV, "1g")
    cmd = [
        _java(), f"-Xmx{heap}", "-Xms128m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true", *jvm_options(),
        f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={workdir / 'logs'}",
        *shlex.split(os.environ.get(JAVA_OPTS_ENV, "")),
        "-cp", _classpath(), "kafka.Kafka", str(config),
    ]  # fmt: skip
    with open(log, "ab") as out:
        # A new session: the broker survives the command that started it and its Ctrl-C.
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _children[proc.pid] = proc
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


# ----------------------------------------------------------------------------------- readiness


def _tcp_open(bootstrap: str, timeout: float = 1.0) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def answers(bootstrap: str, timeout: float = 5.0, conf: dict[str, Any] | None = None) -> bool:
    """Does a Kafka broker at bootstrap answer a metadata request within timeout?"""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    # Probe the port first: librdkafka would log a "Connection refused" line per retry otherwise.
    if not _tcp_open(bootstrap, timeout=min(timeout, 1.0)):
        return False
    admin = AdminClient({**(conf or admin_conf(bootstrap)), "log.connection.close": False})
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


def wait_ready(bootstrap: str, timeout: float = 90.0, pid: int | None = None,
               conf: dict[str, Any] | None = None) -> None:
    """Block until the broker at bootstrap answers; raise BrokerError (with the log) otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        if pid is not None and not _alive(pid):
            raise BrokerError(
                f"the Kafka broker (pid {pid}) exited during start-up; last lines of "
                f"{log_path()}:\n{log_tail()}"
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerError(
                f"the Kafka broker at {bootstrap} did not answer within {timeout:.0f} s; last "
                f"lines of {log_path()}:\n{log_tail()}"
            )
        if answers(bootstrap, timeout=max(0.5, min(5.0, remaining)), conf=conf):
            return
        time.sleep(0.2)


# ------------------------------------------------------------------------------------- public


def start(timeout: float = 90) -> str:
    """Start the bundled broker (or reuse the one already running) and return its bootstrap."""
    with _locked():
        state = _state()
        bootstrap = _bootstrap_of(state)
        pid = _running_pid()
        if pid is not None:
            # Running already (perhaps still starting, launched by another process): reuse it.
            wait_ready(bootstrap, timeout, pid)
            return bootstrap
        _pid_path().unlink(missing_ok=True)
        for port in (v for k, v in state.items() if k.endswith("port")):
            if not _port_free(port):
                raise BrokerError(
                    f"port {HOST}:{port} of the bundled broker is taken by another process; free "
                    f"it, or delete {kafka_dir()} to start over with new ports (and no data)"
                )
        _resolve_jars(force=False)
        config = _write_config(state)
        _format_storage(state, config)
        pid = _launch(state, config)
        try:
            wait_ready(bootstrap, timeout, pid)
        except BrokerError:
            _stop_pid(pid, timeout=10)
            raise
        material = security()
        if material is not None:
            material.write_admin_properties(bootstrap)
        return bootstrap


def _stop_pid(pid: int, timeout: float) -> None:
    terminate(pid, timeout)
    if _read_pid() == pid:
        _pid_path().unlink(missing_ok=True)


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM a broker, then SIGKILL it if it is still alive after timeout."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)  # the broker shuts down cleanly (flushes, closes the log)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    _children.pop(pid, None)


def stop(timeout: float = 30) -> bool:
    """Stop the bundled broker: SIGTERM, then SIGKILL after timeout. False if it was not running."""
    with _locked():
        pid = _running_pid()
        if pid is None:
            _pid_path().unlink(missing_ok=True)
            return False
        _stop_pid(pid, timeout)
        return True


def status() -> dict[str, Any]:
    """Where the bundled broker stands; starts nothing."""
    state = json.loads(_state_path().read_text()) if _state_path().is_file() else None
    pid = _running_pid()
    return {
        "running": pid is not None,
        "pid": pid,
        "bootstrap": _bootstrap_of(state) if state else None,
        "mtls_bootstrap": _bootstrap_of(state, "mtls_port") if state and "mtls_port" in state
        else None,
        "home": str(home()),
        "log": str(log_path()),
        "kafka_version": kafka_version(),
        "jars_ready": jars_ready(),
    }


def resolve_bootstrap(configured: str = "") -> str:
    """The broker address, in the one order used everywhere.

    ``configured`` (a --bootstrap-servers flag or config file, which rollstream.config already
    lets the flag win over ``KAFKA_BOOTSTRAP_SERVERS``) if non-empty; else
    ``KAFKA_BOOTSTRAP_SERVERS`` if set; else the bundled broker, started if it is not running yet.
    """
    if configured.strip() == "local":  # asked for by name
        return start()
    if configured.strip():
        return configured.strip()
    env = os.environ.get(BOOTSTRAP_ENV, "").strip()
    if env:
        return env
    return start()


def with_broker(settings: Settings) -> Settings:
    """`settings` with the broker address resolved (`resolve_bootstrap`): a command that talks to
    Kafka calls this, and only then is the bundled broker started when nothing is configured."""
    return replace(settings, bootstrap_servers=resolve_bootstrap(settings.bootstrap_servers))
