"""The `harness` environment through RunStage.handle: RUN starts the task's harness beside the
episode's sandbox, the harness calls the gateway and runs commands in the sandbox, and how it
ends decides the termination. The harnesses here are small Python programs speaking plain HTTP;
mini-swe-agent itself runs in test_mini_swe_agent.py."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.publish import load_tasks, validate_task
from rollstream.contracts.tool_calls import ToolCall, hermes
from rollstream.dev.background import BackgroundServer
from rollstream.dev.scripted import Script, create_app
from rollstream.envs.base import InvalidTask
from rollstream.envs.harness import HarnessEnv, HarnessSpec
from rollstream.envs.mini_swe_agent import harness_task
from tests.helpers.run_helpers import play, run_settings
from tests.helpers.sandbox_helpers import needs_bwrap, sandbox_root
from tests.helpers.swe_helpers import SHIPPED

__all__ = ["sandbox_root"]

# Calls the gateway once, runs two commands in the sandbox, prints what it saw, exits 0.
PLAIN_HARNESS = textwrap.dedent("""\
    import json, os, urllib.request
    def post(url, body):
        req = urllib.request.Request(url, json.dumps(body).encode(), {
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())
    task = open(os.environ["ROLLSTREAM_TASK_FILE"]).read()
    answer = post(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                  {"messages": [{"role": "user", "content": task}]})
    print("ANSWER", answer["choices"][0]["message"]["content"])
    run = lambda c: post(os.environ["ROLLSTREAM_EXEC_URL"], {"command": c})
    print("HEAD", run("cd /testbed && head -c 40 wordwrap.py")["output"])
    print("WRITE", run("cd /testbed && echo fixed > NOTES.txt")["returncode"])
    print("ENV", sorted(os.environ))
""")
# Calls the gateway until it refuses, then hangs.
GREEDY_HARNESS = textwrap.dedent("""\
    import json, os, time, urllib.request, urllib.error
    req = lambda: urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        json.dumps({"messages": [{"role": "user", "content": "more"}]}).encode(),
        {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        while True:
            urllib.request.urlopen(req()).read()
    except urllib.error.HTTPError:
        time.sleep(600)  # refused: a harness that hangs on, until RUN stops it
""")


@pytest.fixture
def policy_url() -> Iterator[str]:
    with BackgroundServer(app=create_app([Script("", ["hello from the policy"])])) as url:
        yield url


def python(source: str) -> str:
    return f"{sys.executable} - <<'PY'\n{source}PY"


def episode(command: str, max_turns: int = 4, **spec: object) -> dict:
    task = load_tasks(SHIPPED, "swe-bench")[0]
    task = validate_task({**harness_task(task, {"command": command, **spec}),
                          "max_turns": max_turns})
    return {"episode_id": f"{task['task_id']}#0", "task": task, "sample_index": 0,
            "created_at_ms": 0}


def play_one(url: str, ep: dict) -> tuple[dict, dict]:
    [trajectory], _ = asyncio.run(play(run_settings([url]), [ep]))
    return trajectory, json.loads(trajectory["env_state"])


def score(trajectory: dict) -> tuple[float | None, str]:
    result = asyncio.run(HarnessEnv().evaluate(trajectory["task"], trajectory))
    return result.reward, result.failure_class


@needs_bwrap
def test_a_harness_calls_the_gateway_and_works_in_the_sandbox(
        policy_url: str, sandbox_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "must-not-leak:9092")
    trajectory, state = play_one(policy_url, episode(python(PLAIN_HARNESS)))
    assert trajectory["termination"] == "DONE", trajectory["termination_detail"]
    [turn] = trajectory["turns"]
    assert turn["completion_text"] == "hello from the policy"
    output = state["harness"]["output_tail"]
    assert "ANSWER hello from the policy" in output
    assert "HEAD \"\"\"Greedy word wrapping" in output  # the repository is in the sandbox
    assert "WRITE 0" in output
    assert "KAFKA_BOOTSTRAP_SERVERS" not in output  # RUN's own settings stay with RUN
    assert "OPENAI_BASE_URL" in output
    # The answer is the workspace's diff, graded as a swe episode (tests still fail: agent).
    assert "+++ b/NOTES.txt" in state["patch"]
    assert state["submitted"] and state["harness"]["returncode"] == 0
    reward, failure_class = score(trajectory)
    assert (reward, failure_class) == (0.0, "ok")


@needs_bwrap
def test_a_crashing_harness_is_the_agents_failure(policy_url: str, sandbox_root: Path) -> None:
    trajectory, state = play_one(policy_url, episode("echo boom >&2; exit 3"))
    assert trajectory["termination"] == "AGENT_ERROR"
    assert "harness exited 3" in trajectory["termination_detail"]
    assert "boom" in trajectory["termination_detail"]
    assert score(trajectory) == (0.0, "agent")


@needs_bwrap
def test_the_wall_clock_limit_stops_the_harness(policy_url: str, sandbox_root: Path) -> None:
    trajectory, state = play_one(policy_url, episode("sleep 600", wall_clock_s=1))
    assert trajectory["termination"] == "TRUNCATED"
    assert "wall-clock limit of 1 s" in trajectory["termination_detail"]
    assert score(trajectory) == (0.0, "truncated")


@needs_bwrap
def test_a_spent_turn_budget_stops_the_harness(policy_url: str, sandbox_root: Path) -> None:
    trajectory, state = play_one(policy_url, episode(python(GREEDY_HARNESS), max_turns=2))
    assert trajectory["termination"] == "MAX_TURNS"
    assert len(trajectory["turns"]) == 2
    assert state["harness"]["reason"] == "stopped by the gateway"
    assert score(trajectory) == (0.0, "agent")


@pytest.mark.parametrize(("harness", "message"), [
    (None, "'harness' must be an object"),
    ({"command": ""}, "harness.command"),
    ({"command": "x", "wall_clock_s": 0}, "harness.wall_clock_s"),
    ({"command": "x", "max_total_tokens": -5}, "harness.max_total_tokens"),
    ({"command": "x", "env": {"A": 1}}, "harness.env"),
    ({"command": "x", "colour": "red"}, "harness.colour"),
])
def test_a_bad_harness_object_is_named(harness: object, message: str) -> None:
    task = load_tasks(SHIPPED, "swe-bench")[0]
    data = json.loads(task["data"])
    if harness is not None:
        data["harness"] = harness
    with pytest.raises(InvalidTask, match=message.replace(".", r"\.")):
        HarnessEnv().validate_task({**task, "env": "harness", "data": json.dumps(data)})
    assert HarnessSpec.from_task(harness_task(task, {"command": "x"})).command == "x"


def test_harness_tasks_command_writes_publishable_tasks(tmp_path: Path) -> None:
    from rollstream.cli import main

    out, scripts = tmp_path / "tasks.jsonl", tmp_path / "gold.jsonl"
    assert main(["harness-tasks", str(SHIPPED), "-o", str(out), "--max-turns", "7",
                 "--max-total-tokens", "50000", "--gold-scripts", str(scripts)]) == 0
    tasks = load_tasks(out)  # what `rollstream publish` reads
    assert len(tasks) == 26 and {t["env"] for t in tasks} == {"harness"}
    spec = HarnessSpec.from_task(tasks[0])
    assert spec.command.startswith("mini ") and spec.max_total_tokens == 50000
    assert tasks[0]["max_turns"] == 7
    gold = [json.loads(line) for line in scripts.read_text().splitlines()]
    assert [g["match"] for g in gold] == [
        json.loads(t["data"])["problem_statement"].strip() for t in tasks]
    assert all("git apply" in g["completions"][1] for g in gold)
    bad = tmp_path / "bad.json"
    bad.write_text('{"command": ""}')
    assert main(["harness-tasks", str(SHIPPED), "-o", str(out), "--harness", str(bad)]) == 2


HARNESS_PYTHON = Path(__file__).resolve().parents[2] / ".rollstream" / "harness-venv" / \
    "bin" / "python"
# The official OpenAI client (mini-swe-agent's dependency) against the gateway: tools, a tool
# call answered, streaming reassembled by the client itself.
OPENAI_CLIENT_HARNESS = textwrap.dedent("""\
    import json, openai
    client = openai.OpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "list the files"}]
    first = client.chat.completions.create(model="any", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    print("CALL", call.function.name, json.loads(call.function.arguments), flush=True)
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "a.py"}]
    stream = client.chat.completions.create(model="any", messages=messages, tools=tools,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    print("STREAMED", text, flush=True)
""")


@needs_bwrap
@pytest.mark.skipif(not HARNESS_PYTHON.exists(),
                    reason="the harness virtualenv is missing (`make harness-deps`); the "
                           "gateway's wire format is tested in test_gateway.py")
def test_the_openai_client_speaks_to_the_gateway(sandbox_root: Path) -> None:
    answers = [hermes(ToolCall("bash", {"command": "ls"})), "Two files."]
    with BackgroundServer(app=create_app([Script("", answers)])) as url:
        trajectory, state = play_one(url, episode(
            f"{HARNESS_PYTHON} - <<'PY'\n{OPENAI_CLIENT_HARNESS}PY"))
    output = state["harness"]["output_tail"]
    assert trajectory["termination"] == "DONE", output
    assert "CALL bash {'command': 'ls'}" in output
    assert "STREAMED Two files." in output
    assert [t["new_sample"] for t in trajectory["turns"]] == [False, False]
