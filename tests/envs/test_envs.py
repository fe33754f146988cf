"""Built-in environments, the scoring rule shared by all of them, the registry and task files."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from rollstream.cli.envs import register_cli
from rollstream.contracts.codec import codec, pack_ids, pack_logprobs
from rollstream.envs import registry
from rollstream.envs.base import Environment, InvalidTask, Score, StepResult
from rollstream.envs.registry import UnknownEnv, get_env, list_envs

TASKS_DIR = Path(__file__).resolve().parents[2] / "examples" / "tasks"
BUILTIN_NAMES = ["arithmetic", "guess_number", "reverse"]
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 16, "seed": None}
# A right first answer for each env, to show termination overrides even a correct answer.
CORRECT = {
    "arithmetic": ({"answer": "42"}, "42"),
    "guess_number": ({"secret": 7, "low": 0, "high": 15}, "7"),
    "reverse": ({"text": "abc"}, "cba"),
}


def make_task(env: str, data: dict, max_turns: int = 1) -> dict:
    """A Task dict as the codec decodes it: data is a JSON string."""
    return {
        "task_id": f"{env}-t",
        "env": env,
        "prompt": "p",
        "data": json.dumps(data),
        "group_size": 4,
        "max_turns": max_turns,
        "sampling": SAMPLING,
        "metadata": {},
        "created_at_ms": 0,
    }


def make_turn(index: int, text: str, result: StepResult | None = None) -> dict:
    return {
        "index": index,
        "prompt_ids": pack_ids([1, 2]),
        "completion_ids": pack_ids([3]),
        "logprobs": pack_logprobs([-0.5]),
        "policy_version": 0,
        "finish_reason": "stop",
        "completion_text": text,
        "tool_call": result.tool_call if result else None,
        "observation": result.observation if result else None,
        "server": "",
        "started_at_ms": 0,
        "inference_ms": 1.0,
        "env_ms": 0.0,
    }


def make_trajectory(
    task: dict, texts: list[str], termination: str = "DONE", state: dict | None = None
) -> dict:
    return {
        "episode_id": "e-0",
        "task": task,
        "sample_index": 0,
        "turns": [make_turn(i, text) for i, text in enumerate(texts)],
        "termination": termination,
        "termination_detail": "",
        "env_state": json.dumps(state or {}),
        "started_at_ms": 0,
        "finished_at_ms": 1,
    }


async def play(env: Environment, task: dict, texts: list[str]) -> tuple[list[StepResult], dict]:
    """Run completions through reset/step until done; returns the steps and the trajectory."""
    state = await env.reset(task)
    steps: list[StepResult] = []
    turns = []
    for i, text in enumerate(texts):
        result = await env.step(task, state, text)
        steps.append(result)
        turns.append(make_turn(i, text, result))
        state = result.state
        if result.done:
            break
    termination = "DONE" if steps[-1].done else "RUNNING"
    trajectory = make_trajectory(task, [], termination, state)
    trajectory["turns"] = turns
    return steps, trajectory


def score(env_name: str, data: dict, texts: list[str], max_turns: int = 1) -> Score:
    env = get_env(env_name)
    task = make_task(env_name, data, max_turns)

    async def go() -> Score:
        _, trajectory = await play(env, task, texts)
        return await env.evaluate(task, trajectory)

    return asyncio.run(go())


# --- arithmetic -----------------------------------------------------------------------------


def test_arithmetic_step_is_single_turn_and_records_the_answer() -> None:
    env = get_env("arithmetic")
    task = make_task("arithmetic", {"answer": "42"})
    steps, _ = asyncio.run(play(env, task, ["The answer is 42."]))
    assert steps == [StepResult(None, True, json.dumps({"answer": 42}), {"answer": 42})]


@pytest.mark.parametrize(
    ("answer", "text", "reward", "failure_class"),
    [
        ("42", "42", 1.0, "ok"),
        (42, " it is 42!", 1.0, "ok"),
        ("42", "41", 0.0, "ok"),
        ("42", "17 or 42", 0.0, "ok"),  # only the first integer counts
        ("-8", "-8", 1.0, "ok"),
        ("42", "forty-two", 0.0, "agent"),
        ("42", "", 0.0, "agent"),
    ],
)
def test_arithmetic_scores(answer, text, reward, failure_class) -> None:
    result = score("arithmetic", {"answer": answer}, [text])
    assert (result.reward, result.failure_class) == (reward, failure_class)
    json.dumps(result.verifier)


def test_arithmetic_with_no_turns_is_an_agent_failure() -> None:
    env = get_env("arithmetic")
    task = make_task("arithmetic", {"answer": "1"})
    result = asyncio.run(env.evaluate(task, make_trajectory(task, [])))
    assert (result.reward, result.failure_class) == (0.0, "agent")


# --- reverse --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "completion", "reward", "failure_class"),
    [
        ("abc", "cba", 1.0, "ok"),
        ("abc", "  cba\n", 1.0, "ok"),  # surrounding whitespace is not part of the answer
        ("abc", "cbx", 2 / 3, "ok"),
        ("abc", "cbaaaa", 0.5, "ok"),  # trailing text is penalized
        ("abc", "abc", 1 / 3, "ok"),
        ("abc", "xyz", 0.0, "ok"),
        ("abc", "   ", 0.0, "agent"),
    ],
)
def test_reverse_scores(text, completion, reward, failure_class) -> None:
    result = score("reverse", {"text": text}, [completion])
    assert result.reward == pytest.approx(reward)
    assert result.failure_class == failure_class
    json.dumps(result.verifier)


def test_reverse_step_ends_the_episode() -> None:
    env = get_env("reverse")
    steps, _ = asyncio.run(play(env, make_task("reverse", {"text": "ab"}), ["ba", "ba"]))
    assert len(steps) == 1
    assert steps[0].done and steps[0].observation is None
    assert json.loads(steps[0].tool_call) == {"answer": "ba"}


# --- guess_number ---------------------------------------------------------------------------

GUESS = {"secret": 7, "low": 0, "high": 15}


def test_guess_number_plays_with_hints() -> None:
    env = get_env("guess_number")
    task = make_task("guess_number", GUESS, max_turns=6)
    steps, trajectory = asyncio.run(play(env, task, ["8", "hmm", "I guess 3", "7", "7"]))
    assert [s.observation for s in steps] == ["lower", "answer with a number", "higher", None]
    assert [s.done for s in steps] == [False, False, False, True]
    assert [s.tool_call for s in steps] == ['{"guess": 8}', None, '{"guess": 3}', '{"guess": 7}']
    assert steps[-1].state == {"guesses": [8, None, 3, 7]}
    result = asyncio.run(env.evaluate(task, trajectory))
    assert result == Score(0.7, "ok", {"secret": 7, "guesses": [8, None, 3, 7]})


@pytest.mark.parametrize(
    ("texts", "max_turns", "reward", "failure_class"),
    [
        (["7"], 6, 1.0, "ok"),
        (["1", "2", "3"], 3, 0.0, "ok"),  # never found within max_turns
        (["x", "y"], 2, 0.0, "agent"),  # never a number
        ([str(n) for n in range(8)], 8, 0.3, "ok"),
        (["0"] * 11 + ["7"], 12, 0.1, "ok"),  # the floor, not 1.0 - 1.1
    ],
)
def test_guess_number_scores(texts, max_turns, reward, failure_class) -> None:
    result = score("guess_number", GUESS, texts, max_turns)
    assert (result.reward, result.failure_class) == (pytest.approx(reward), failure_class)


def test_guess_number_stops_at_max_turns() -> None:
    env = get_env("guess_number")
    task = make_task("guess_number", GUESS, max_turns=2)
    steps, _ = asyncio.run(play(env, task, ["1", "2", "3"]))
    assert [(s.observation, s.done) for s in steps] == [("higher", False), (None, True)]


def test_guess_number_step_does_not_mutate_the_state() -> None:
    env = get_env("guess_number")
    task = make_task("guess_number", GUESS, max_turns=6)
    state = {"guesses": [3]}
    asyncio.run(env.step(task, state, "5"))
    assert state == {"guesses": [3]}


def test_state_survives_a_json_checkpoint_and_resumes_identically() -> None:
    task = make_task("guess_number", GUESS, max_turns=6)
    texts = ["12", "2", "nope", "6", "7"]

    async def straight() -> list[StepResult]:
        steps, _ = await play(get_env("guess_number"), task, texts)
        return steps

    async def resumed() -> list[StepResult]:
        first = get_env("guess_number")
        state = await first.reset(task)
        steps = []
        for text in texts[:2]:
            steps.append(await first.step(task, state, text))
            state = steps[-1].state
        # As RUN does: checkpoint as JSON, resume in a fresh environment instance.
        state = json.loads(json.dumps(state))
        second = get_env("guess_number")
        for text in texts[2:]:
            steps.append(await second.step(task, state, text))
            state = steps[-1].state
        return steps

    assert asyncio.run(resumed()) == asyncio.run(straight())


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_every_state_is_json_serializable(name) -> None:
    data, text = CORRECT[name]
    env = get_env(name)
    task = make_task(name, data, max_turns=4)
    state = asyncio.run(env.reset(task))
    assert json.loads(json.dumps(state)) == state
    result = asyncio.run(env.step(task, state, text))
    assert json.loads(json.dumps(result.state)) == result.state


def test_scoring_a_trajectory_decoded_from_avro() -> None:
    # The real path: RUN encodes the Trajectory, EVAL decodes it and scores it.
    env = get_env("guess_number")
    task = make_task("guess_number", GUESS, max_turns=6)
    _, trajectory = asyncio.run(play(env, task, ["4", "7"]))
    c = codec()
    decoded = c.decode_as("Trajectory", c.encode("Trajectory", trajectory))
    result = asyncio.run(env.evaluate(decoded["task"], decoded))
    assert (result.reward, result.failure_class) == (0.9, "ok")
    scored = {
        "trajectory": decoded,
        "reward": result.reward,
        "failure_class": result.failure_class,
        "verifier": json.dumps(result.verifier),
        "scored_at_ms": 1,
    }
    assert c.decode_as("ScoredTrajectory", c.encode("ScoredTrajectory", scored))["reward"] == 0.9


# --- the termination rule -------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTIN_NAMES)
@pytest.mark.parametrize(
    ("termination", "reward", "failure_class"),
    [
        ("TRUNCATED", 0.0, "truncated"),
        ("AGENT_ERROR", 0.0, "agent"),
        ("ENV_ERROR", None, "env"),
        ("INFRA_ERROR", None, "infra"),
        ("RUNNING", None, "infra"),
    ],
)
def test_termination_decides_before_the_answer(name, termination, reward, failure_class) -> None:
    data, text = CORRECT[name]
    task = make_task(name, data, max_turns=4)
    trajectory = make_trajectory(task, [text], termination)
    trajectory["termination_detail"] = "why"
    result = asyncio.run(get_env(name).evaluate(task, trajectory))
    assert (result.reward, result.failure_class) == (reward, failure_class)
    assert result.verifier == {"termination": termination, "detail": "why"}


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_max_turns_termination_is_scored_by_the_env(name) -> None:
    data, text = CORRECT[name]
    task = make_task(name, data, max_turns=4)
    result = asyncio.run(get_env(name).evaluate(task, make_trajectory(task, [text], "MAX_TURNS")))
    assert (result.reward, result.failure_class) == (1.0, "ok")


# --- validate_task --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "max_turns", "field"),
    [
        ("arithmetic", {}, 1, "'answer'"),
        ("arithmetic", {"answer": "forty"}, 1, "'answer'"),
        ("arithmetic", {"answer": True}, 1, "'answer'"),
        ("reverse", {"txt": "abc"}, 1, "'text'"),
        ("reverse", {"text": ""}, 1, "'text'"),
        ("reverse", {"text": 5}, 1, "'text'"),
        ("guess_number", {"low": 0, "high": 15}, 6, "'secret'"),
        ("guess_number", {"secret": 7, "high": 15}, 6, "'low'"),
        ("guess_number", {"secret": 7, "low": 0}, 6, "'high'"),
        ("guess_number", {"secret": 16, "low": 0, "high": 15}, 6, "'secret'"),
        ("guess_number", GUESS, 0, "'max_turns'"),
    ],
)
def test_validate_task_names_the_field(name, data, max_turns, field) -> None:
    with pytest.raises(InvalidTask, match=field):
        get_env(name).validate_task(make_task(name, data, max_turns))


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]"])
def test_validate_task_rejects_data_that_is_not_a_json_object(raw) -> None:
    task = make_task("arithmetic", {})
    task["data"] = raw
    with pytest.raises(InvalidTask, match="'data'"):
        get_env("arithmetic").validate_task(task)


def test_invalid_task_is_a_value_error() -> None:
    assert issubclass(InvalidTask, ValueError)


# --- registry and CLI -----------------------------------------------------------------------


@pytest.fixture
def fresh_registry():
    registry._environments.cache_clear()
    yield
    registry._environments.cache_clear()


def test_list_envs_has_every_builtin() -> None:
    envs = dict(list_envs())
    assert set(BUILTIN_NAMES) <= set(envs)
    assert all(envs[name] for name in BUILTIN_NAMES)
    for name in BUILTIN_NAMES:
        env = get_env(name)
        assert isinstance(env, Environment) and env.name == name


def test_unknown_env_error_lists_known_names() -> None:
    with pytest.raises(KeyError) as info:
        get_env("no_such_env")
    assert isinstance(info.value, UnknownEnv)
    message = str(info.value)
    assert "'no_such_env'" in message
    assert all(name in message for name in BUILTIN_NAMES)


def _fake_entry_points(*eps: EntryPoint):
    def entry_points(group: str) -> tuple[EntryPoint, ...]:
        assert group == "rollstream.envs"
        return eps

    return entry_points


def test_plugins_come_from_entry_points(monkeypatch, fresh_registry) -> None:
    ep = EntryPoint("reverse_plugin", "rollstream.envs.reverse:Reverse", "rollstream.envs")
    monkeypatch.setattr(registry, "entry_points", _fake_entry_points(ep))
    assert "reverse_plugin" in dict(list_envs())
    assert get_env("reverse_plugin").name == "reverse"


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("arithmetic", "rollstream.envs.reverse:Reverse", "built-in"),
        ("bad", "json:dumps", "not an Environment"),
        ("missing", "no_such_module_xyz:Env", "failed to load"),
    ],
)
def test_bad_plugins_are_named(monkeypatch, fresh_registry, name, value, error) -> None:
    ep = EntryPoint(name, value, "rollstream.envs")
    monkeypatch.setattr(registry, "entry_points", _fake_entry_points(ep))
    with pytest.raises(RuntimeError, match=f"'{name}'.*{error}"):
        list_envs()


def test_envs_command_prints_aligned_names(capsys) -> None:
    parser = argparse.ArgumentParser()
    register_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["envs"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [name for name, _ in list_envs()]
    columns = {
        len(line) - len(description)
        for line, (_, description) in zip(lines, list_envs(), strict=True)
    }
    assert len(columns) == 1  # every description starts in the same column


# --- example task files ---------------------------------------------------------------------


def _load_tasks(name: str) -> list[dict]:
    lines = (TASKS_DIR / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_example_tasks_validate_and_encode(name) -> None:
    tasks = _load_tasks(name)
    assert 20 <= len(tasks) <= 50
    assert len({t["task_id"] for t in tasks}) == len(tasks)
    env = get_env(name)
    c = codec()
    for task in tasks:
        assert task["env"] == name
        assert task["group_size"] == 4
        assert task["max_turns"] == (6 if name == "guess_number" else 1)
        assert task["sampling"] == SAMPLING
        assert isinstance(task["data"], dict)
        env.validate_task(task)
        encoded = dict(task, data=json.dumps(task["data"]))
        decoded = c.decode_as("Task", c.encode("Task", encoded))
        env.validate_task(decoded)
        assert json.loads(decoded["data"]) == task["data"]


def test_example_arithmetic_answers_match_their_prompts() -> None:
    for task in _load_tasks("arithmetic"):
        a, op, b = re.fullmatch(r"What is (\d+)([+-])(\d+)\?", task["prompt"]).groups()
        expected = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert int(task["data"]["answer"]) == expected, task["task_id"]


def test_example_reverse_prompts_show_their_text() -> None:
    for task in _load_tasks("reverse"):
        assert task["prompt"].endswith(task["data"]["text"]), task["task_id"]
