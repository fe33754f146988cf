"""The topic graph (rollstream/contracts/graph.py) against what the code, the README's drawing and
the table in docs/concepts.md actually do."""

from __future__ import annotations

import ast
import asyncio
import re
from pathlib import Path

import pytest

from rollstream.config import Settings
from rollstream.contracts import events
from rollstream.contracts.graph import BY_ATTR, GRAPH, STAGES, TRAINER, Topics, input_of, table
from rollstream.runtime import EventContext, Output, Stage
from stages.eval import EvalStage
from stages.init import InitStage
from stages.run import RunStage
from tests.helpers.scored_factory import scored

ROOT = Path(__file__).resolve().parents[2]
STAGE_CLASSES: list[type[Stage]] = [InitStage, RunStage, EvalStage]
# Files that produce Outputs, and the writer they are in the graph.
WRITER_FILES = {"stages/init.py": "init", "stages/run.py": "run", "stages/eval.py": "eval",
                "trainer_bridge/train_loop.py": TRAINER}


def test_topic_names_and_groups_come_from_the_graph() -> None:
    topics = Topics("p")
    names = [n for n in vars(Topics) if not n.startswith("_") and n not in ("group", "prefix")]
    assert sorted(names) == sorted(BY_ATTR)
    for topic in GRAPH:
        assert getattr(topics, topic.attr) == f"p.{topic.suffix}"
        # "": a topic of empty markers (rollstream.dedup), not Avro records.
        assert topic.record == "" or topic.record in events.__dict__.values()
    assert topics.group("run") == "p.run"
    assert BY_ATTR["policy"].partitions == 1  # a total order of versions
    with pytest.raises(ValueError):
        input_of("trainer")  # not a consumer group: reads <p>.policy by assignment


def test_each_stage_reads_its_graph_input() -> None:
    settings = Settings(prefix="p")
    assert sorted(cls.name for cls in STAGE_CLASSES) == sorted(STAGES)
    for cls in STAGE_CLASSES:
        stage = cls(settings)
        source = input_of(cls.name)
        assert stage.input_topic() == source.name(settings.topics), cls.name
        assert stage.input_record == source.record, cls.name


def _check_edge(writer: str, topic_name: str, record: str | None, topics: Topics) -> None:
    [topic] = [t for t in GRAPH if t.name(topics) == topic_name]
    assert writer in topic.writers, f"{writer} writes {topic_name}, not an edge of the graph"
    if record is None:  # a tombstone or a marker: only on a compacted topic
        assert "compact" in topic.config.get("cleanup.policy", ""), topic_name
    else:
        assert record == topic.record, f"{writer} writes {record} to {topic_name}"


def _record_names(node: ast.expr) -> list[str | None]:
    """The record names an Output's `record` argument can take (constants, events.X, a ternary)."""
    if isinstance(node, ast.IfExp):
        return _record_names(node.body) + _record_names(node.orelse)
    if isinstance(node, ast.Constant):
        return [node.value]
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    assert name is not None and hasattr(events, name), f"record {ast.unparse(node)} unknown"
    return [getattr(events, name)]


def test_every_output_in_the_code_is_an_edge_of_the_graph() -> None:
    """Every `Output(<topics>.X, key, RECORD, ...)` written anywhere is a declared edge, and every
    declared edge is written somewhere (but the dead-letter topic, which the runtime writes, and
    the seen markers, which rollstream.dedup builds for INIT and EVAL)."""
    topics = Topics("p")
    found: set[tuple[str, str]] = set()
    for path, writer in WRITER_FILES.items():
        tree = ast.parse((ROOT / path).read_text())
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", None) == "Output"]
        assert calls, f"no Output in {path}"
        for call in calls:
            target = call.args[0]
            assert isinstance(target, ast.Attribute), ast.unparse(call)
            for record in _record_names(call.args[2]):
                _check_edge(writer, getattr(topics, target.attr), record, topics)
            found.add((writer, target.attr))
    declared = {(w, t.attr) for t in GRAPH if t.attr not in ("dlq", "seen") for w in t.writers
                if w in WRITER_FILES.values()}
    assert declared == found


def test_init_and_eval_outputs_on_sample_events_are_edges() -> None:
    settings = Settings(prefix="p")
    topics = settings.topics
    ctx = EventContext(0, 0, lambda out: pytest.fail(f"unexpected emit {out}"))
    event = scored("t1", 0, 1.0)
    task, trajectory = event["trajectory"]["task"], event["trajectory"]
    trajectory["turns"][0]["completion_text"] = "a"
    outputs: list[tuple[str, Output]] = [("init", o) for o in InitStage(settings).handle(task, ctx)]
    outputs += [("eval", o) for o in asyncio.run(EvalStage(settings).handle(trajectory, ctx))]
    # The group's episodes, the scored trajectory, and INIT's and EVAL's seen markers.
    assert len(outputs) == task["group_size"] + 1 + 2
    for writer, out in outputs:
        _check_edge(writer, out.topic, out.record, topics)


def _section(path: str, section: str) -> str:
    text = (ROOT / path).read_text()
    return text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]


def test_docs_table_is_the_graph() -> None:
    assert table() in _section("docs/concepts.md", "The topic graph")


ARROWS = re.compile(r"(──►|◄──)")
NODE = re.compile(r"<p>\.([a-z-]+)|\[(\w+)\]|\b(producers|trainer)\b")


def test_readme_diagram_draws_only_edges_of_the_graph() -> None:
    """Every arrow between two named things in the README's drawing is an edge of the graph, and
    the drawing shows every topic."""
    diagram = (ROOT / "README.md").read_text().split("```\n", 2)[1]  # the first code block
    by_suffix = {t.suffix: t for t in GRAPH}
    assert set(re.findall(r"<p>\.([a-z-]+)", diagram)) == set(by_suffix)
    checked = 0
    for line in diagram.splitlines():
        parts = ARROWS.split(line)
        for i in range(1, len(parts) - 1, 2):
            left, right = NODE.findall(parts[i - 1]), NODE.findall(parts[i + 1])
            if not left or not right:
                continue  # an arrow to something outside the graph (servers, the trainer's API)
            a, b = left[-1], right[0]
            src, dst = (a, b) if parts[i] == "──►" else (b, a)
            if src[0] and not dst[0]:  # topic -> reader
                topic, reader = by_suffix[src[0]], (dst[1] or dst[2]).lower()
                assert reader in topic.groups + topic.followers, (line, reader)
            elif dst[0] and not src[0]:  # writer -> topic
                topic, writer = by_suffix[dst[0]], (src[1] or src[2]).lower()
                assert writer in topic.writers, (line, writer)
            else:
                continue  # the bridge hands batches to the trainer in-process
            checked += 1
    assert checked >= 6


def test_the_demo_reads_every_partition_each_topic_has(settings: Settings, tmp_path: Path) -> None:
    from rollstream.dev.loop import ClosedLoop, LoopConfig

    loop = ClosedLoop(settings, tmp_path, LoopConfig())
    try:
        policy, scored_reader = loop._reader("policy"), loop._reader("scored")
        assert [tp.partition for tp in policy.assignment()] == [0]  # <p>.policy has one
        assert sorted(tp.partition for tp in scored_reader.assignment()) == list(
            range(settings.partitions))
    finally:
        loop.stop()
