"""A local multi-node Kafka cluster (KRaft) for failover tests and benchmarks.

`rollstream broker start --nodes 3` runs three combined broker+controller JVMs on 127.0.0.1
with the same jars as the single bundled broker, configured as a small production cluster:
replication factor 3 by default, `min.insync.replicas=2`, the consumer-offsets and transaction
state logs replicated three ways (min ISR 2). One node can die and produce, consume and
transactions go on; that is what it is for: killing a partition leader or the active controller
and watching the pipeline carry on.

Layout under $ROLLSTREAM_HOME/cluster/: cluster.json (cluster id and ports, kept), and per node
node<N>/ with server.properties, data/, broker.log and broker.pid.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollstream.broker import local
from rollstream.broker.local import HOST, BrokerError

# Overrides of the single node's settings for a replicated cluster.
CLUSTER_SETTINGS: dict[str, str] = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    # A killed node's partitions move to the others quickly (the default is 9 s / 18 s).
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
    "controller.quorum.fetch.timeout.ms": "2000",
    "controller.quorum.election.timeout.ms": "1000",
    "unclean.leader.election.enable": "false",
    # A node that comes back leads nothing until the preferred leaders are elected again; until
    # then two nodes serve everything, and the pipeline ran at about 2/3 of its rate for up to
    # the default check interval (300 s) after a partition-leader kill.
    "leader.imbalance.check.interval.seconds": "10",
}


QUORUM_LEADER = Path(__file__).with_name("QuorumLeader.java")


def cluster_dir() -> Path:
    return local.home() / "cluster"


def node_dir(node: int) -> Path:
    return cluster_dir() / f"node{node}"


def _state_path() -> Path:
    return cluster_dir() / "cluster.json"


def _pid_path(node: int) -> Path:
    return node_dir(node) / "broker.pid"


def state() -> dict[str, Any] | None:
    """The cluster's id and ports, or None before its first start."""
    path = _state_path()
    return dict(json.loads(path.read_text())) if path.is_file() else None


def _new_state(nodes: int) -> dict[str, Any]:
    ports: set[int] = set()
    while len(ports) < 2 * nodes:
        ports.add(local._free_port())
    ordered = sorted(ports)
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    st = {"cluster_id": cluster_id, "nodes": [
        {"id": i + 1, "port": ordered[2 * i], "controller_port": ordered[2 * i + 1]}
        for i in range(nodes)]}
    local.add_listener_ports(st["nodes"])
    _save(st)
    return st


def _save(st: dict[str, Any]) -> None:
    cluster_dir().mkdir(parents=True, exist_ok=True)
    _state_path().write_text(json.dumps(st, indent=2) + "\n")


def bootstrap_of(st: dict[str, Any], port: str = "port") -> str:
    """The nodes' addresses on one listener (`port`: the key of its port)."""
    return ",".join(f"{HOST}:{n[port]}" for n in st["nodes"])


def _node(st: dict[str, Any], node: int) -> dict[str, Any]:
    return next(n for n in st["nodes"] if n["id"] == node)


def _write_config(st: dict[str, Any], node: int) -> Path:
    me = _node(st, node)
    voters = ",".join(f"{n['id']}@{HOST}:{n['controller_port']}" for n in st["nodes"])
    settings = {**local.BROKER_SETTINGS, **CLUSTER_SETTINGS, **local.security_settings()}
    lines = [
        "# Written by rollstream.broker.cluster at every start.",
        "process.roles=broker,controller",
        f"node.id={node}",
        f"controller.quorum.voters={voters}",
        *local.listener_lines(me),
        f"log.dirs={node_dir(node) / 'data'}",
        *(f"{k}={v}" for k, v in settings.items()),
    ]
    path = node_dir(node) / "server.properties"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)  # a secured cluster's holds the admin's password
    return path


def _recorded_pid(node: int) -> int | None:
    """The pid in the node's pid file (possibly stale: a recycled pid)."""
    try:
        return int(_pid_path(node).read_text().strip())
    except (OSError, ValueError):
        return None


def pid(node: int) -> int | None:
    """The node's broker pid while it runs."""
    value = _recorded_pid(node)
    return value if value is not None and local._is_our_broker(value) else None


def running_nodes() -> list[int]:
    st = state()
    return [] if st is None else [n["id"] for n in st["nodes"] if pid(n["id"]) is not None]


def start_node(node: int) -> int:
    """Start one node of the cluster (after a kill, say); returns its pid."""
    st = state()
    if st is None:
        raise BrokerError("no cluster here yet: start it with `rollstream broker start --nodes 3`")
    running = pid(node)
    if running is not None:
        return running
    node_dir(node).mkdir(parents=True, exist_ok=True)
    config = _write_config(st, node)
    local.format_storage(node_dir(node) / "data", st["cluster_id"], config, standalone=False)
    return local.launch(config, node_dir(node), node_dir(node) / "broker.log", _pid_path(node))


def start(nodes: int = 3, timeout: float = 120) -> str:
    """Start the cluster (or the nodes of it that are down) and wait until every node is a
    broker of it; returns the bootstrap list."""
    if nodes < 2:
        raise BrokerError("a cluster has 2 or more nodes; the single broker is `broker start`")
    local.resolve_jars()
    st = state()
    if st is not None and len(st["nodes"]) != nodes:
        raise BrokerError(f"the cluster in {cluster_dir()} has {len(st['nodes'])} nodes; stop it "
                          f"and delete that folder to start one of {nodes}")
    if st is None:
        st = _new_state(nodes)
    elif local.add_listener_ports(st["nodes"]):
        _save(st)
    # Formatting is a JVM start per node: done for all first, in parallel.
    for n in st["nodes"]:
        node_dir(n["id"]).mkdir(parents=True, exist_ok=True)
    formats = [_format_async(st, n["id"]) for n in st["nodes"] if pid(n["id"]) is None]
    for proc in formats:
        if proc is not None and proc.wait(timeout=180) != 0:
            raise BrokerError(f"formatting a cluster node failed: {proc.stdout.read()[-2000:]}")
    for n in st["nodes"]:
        start_node(n["id"])
    bootstrap = bootstrap_of(st)
    wait_ready(bootstrap, nodes, timeout)
    material = local.security()
    if material is not None:
        material.write_admin_properties(bootstrap)
    return bootstrap


def _format_async(st: dict[str, Any], node: int) -> subprocess.Popen[str] | None:
    data = node_dir(node) / "data"
    if (data / "meta.properties").is_file():
        return None
    config = _write_config(st, node)
    return subprocess.Popen(
        [local._java(), "-Xmx256m", *local.jvm_options(), "-cp", local._classpath(),
         "kafka.tools.StorageTool", "format", f"--cluster-id={st['cluster_id']}", "-c", str(config),
         "--ignore-formatted", *local.format_args()],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def brokers(bootstrap: str, timeout: float = 5.0) -> set[int]:
    """Ids of the brokers the cluster's metadata lists now (empty if none answers)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    if not any(local._tcp_open(address, 0.5) for address in bootstrap.split(",")):
        return set()  # nobody listens yet: no client, so no "connection refused" log lines
    admin = AdminClient({**local.admin_conf(bootstrap), "log.connection.close": False,
                         "log_level": 0})
    try:
        return set(admin.list_topics(timeout=timeout).brokers)
    except KafkaException:
        return set()


def wait_ready(bootstrap: str, nodes: int, timeout: float = 120) -> None:
    """Block until the metadata lists `nodes` live brokers."""
    deadline = time.monotonic() + timeout
    # The pids just started (or found running): whether they live is all that matters here,
    # as for the single broker. pid()'s command-line check is for stale pid files, and a JVM
    # that has just been launched once failed it on a loaded machine.
    launched = {n: _recorded_pid(n) for n in range(1, nodes + 1)}
    while len(brokers(bootstrap)) < nodes:
        dead = [n for n, p in launched.items() if p is None or not local._alive(p)]
        if dead:
            log = node_dir(dead[0]) / "broker.log"
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) \
                if log.is_file() else "(no log)"
            raise BrokerError(f"cluster node {dead[0]} is not running; {log}:\n{tail}")
        if time.monotonic() > deadline:
            raise BrokerError(f"the cluster at {bootstrap} did not list {nodes} brokers within "
                              f"{timeout:.0f} s")
        time.sleep(0.5)


def kill_node(node: int, sig: int = signal.SIGKILL) -> bool:
    """Signal one node (SIGKILL by default: a crash); False if it was not running."""
    running = pid(node)
    if running is None:
        return False
    os.kill(running, sig)
    deadline = time.monotonic() + 30
    while local._alive(running) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


def stop(timeout: float = 30) -> list[int]:
    """Stop every running node (SIGTERM, then SIGKILL after timeout); the ids stopped.

    All nodes at once: stopped one after another, the last one waited for a controller quorum
    that had left before it until the timeout (3 nodes took 38 s that way, 9 s at once)."""
    running = {node: p for node in running_nodes() if (p := pid(node)) is not None}
    with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
        list(pool.map(lambda p: local.terminate(p, timeout), running.values()))
    for node in running:
        _pid_path(node).unlink(missing_ok=True)
    return sorted(running)


def partition_leader(bootstrap: str, topic: str, partition: int = 0,
                     timeout: float = 10) -> int:
    """The broker id leading `topic`'s partition now."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**local.admin_conf(bootstrap), "log_level": 0})
    return int(admin.list_topics(topic, timeout=timeout).topics[topic].partitions[partition].leader)


def active_controller(bootstrap: str, timeout: float = 120) -> int:
    """The node leading the KRaft quorum (the active controller), asked through Kafka's own
    Admin API (QuorumLeader.java, run by the JVM's source launcher: the Python client has no
    such call)."""
    proc = subprocess.run(
        [local._java(), "-Xmx128m", *local.JIT_OPTIONS, "-cp", local._classpath(),
         str(QUORUM_LEADER), bootstrap],
        capture_output=True, text=True, timeout=timeout)
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    if proc.returncode != 0 or not last[0].isdigit():
        output = (proc.stdout + proc.stderr)[-2000:]
        raise BrokerError(f"could not read the quorum leader: {output}")
    return int(last[0])
