"""The `swe` environment in-process on bwrap sandboxes: the shipped task set against its gold
and empty patches, the scaffold against scripted tool-call sequences (malformed ones included),
resume in another process, failure classes. No broker here: tests/envs/test_swe_pipeline.py runs
the same through Kafka."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rollstream.envs.swe.env import SweEnv
from rollstream.envs.swe.gold import gold_script
from rollstream.envs.swe.grading import grade
from rollstream.envs.swe.instance import SweInstance
from rollstream.sandbox import backends
from rollstream.sandbox.docker import IMAGE_ENV
from tests.helpers.sandbox_helpers import backend, needs_bwrap, sandbox_root
from tests.helpers.swe_helpers import call, play, shipped

__all__ = ["backend", "sandbox_root"]


def test_the_shipped_set_is_large_enough_and_well_formed() -> None:
    tasks = shipped()
    assert len(tasks) >= 24
    for task in tasks:
        instance = SweInstance.from_task(task)
        assert instance.snapshot and instance.gold_patch and instance.test_patch
        assert instance.fail_to_pass and instance.pass_to_pass and instance.base_commit


def test_every_shipped_task_resolves_with_its_gold_patch_and_not_without(backend: str) -> None:
    instances = [SweInstance.from_task(t) for t in shipped()]

    async def all_of_them():
        gold = [grade(i, i.gold_patch) for i in instances]
        empty = [grade(i, "") for i in instances]
        # Only the tests changed (the test patch as the answer): the tests run and fail.
        tests_only = [grade(i, i.test_patch) for i in instances[:3]]
        return await asyncio.gather(*gold), await asyncio.gather(*empty, *tests_only)

    gold, (*empty, ) = asyncio.run(all_of_them())
    for instance, score in zip(instances, gold, strict=True):
        assert (score.reward, score.failure_class) == (1.0, "ok"), (instance.instance_id,
                                                                    score.verifier)
    for score in empty[: len(instances)]:
        assert (score.reward, score.failure_class) == (0.0, "agent")
        assert score.verifier["reason"] == "empty patch"
    for score in empty[len(instances):]:
        assert (score.reward, score.failure_class) == (0.0, "ok")
        assert score.verifier["failing"]["FAIL_TO_PASS"]


@needs_bwrap
def test_a_patch_that_does_not_apply_is_an_agent_failure(sandbox_root: Path) -> None:
    instance = SweInstance.from_task(shipped("romans")[0])
    bad = instance.gold_patch.replace("VALUES[ch]", "VALUES[c]")  # context that is not there
    score = asyncio.run(grade(instance, bad))
    assert (score.reward, score.failure_class) == (0.0, "agent")
    assert score.verifier["reason"] == "patch does not apply"
    assert "patch --batch" in score.verifier["log"]  # every fallback was tried


@needs_bwrap
def test_gold_patch_replayed_through_the_tools_resolves(sandbox_root: Path) -> None:
    task = shipped("deepmerge")[0]
    score, observations, state = asyncio.run(play(task, gold_script(
        SweInstance.from_task(task))))
    assert (score.reward, score.failure_class) == (1.0, "ok"), score.verifier
    assert state["submitted"] and state["exit"] == "submitted"
    assert "has been edited" in observations[0]


@needs_bwrap
def test_scaffold_answers_every_kind_of_bad_call_and_keeps_going(sandbox_root: Path) -> None:
    task = shipped("wordwrap")[0]
    path = "/testbed/wordwrap.py"
    fix_old = "            current = word\n    return lines"
    fix_new = "            current = word\n    if current:\n        lines.append(current)\n" \
              "    return lines"
    completions = [
        "I will look around first.",  # no tool call at all
        "<tool_call>{\"name\": \"bash\", \"arguments\": {\"command\": </tool_call>",  # bad JSON
        call("rm_rf"),  # unknown tool
        call("str_replace_editor", command="view", path="/testbed"),
        call("str_replace_editor", command="view", path=path, view_range=[4, 6]),
        call("str_replace_editor", command="create", path=path, file_text="x"),  # exists
        call("str_replace_editor", command="str_replace", path=path, old_str="nope"),
        call("str_replace_editor", command="str_replace", path=path, old_str="current"),
        call("str_replace_editor", command="insert", path=path, insert_line=999, new_str="x"),
        call("str_replace_editor", command="view"),  # no path
        call("bash", command="exit 3"),
        call("bash", command="sleep 30"),  # past the per-command timeout
        call("bash", command="seq 1 100000"),  # past the observation cap
        # OpenAI form, arguments as a JSON string:
        json.dumps({"tool_calls": [{"type": "function", "function": {
            "name": "str_replace_editor", "arguments": json.dumps({
                "command": "str_replace", "path": path, "old_str": fix_old,
                "new_str": "BROKEN"})}}]}),
        call("str_replace_editor", command="undo_edit", path=path),
        # Two calls in one completion; the second lost its closing tag (a stop at max_tokens)
        # and is still read:
        call("str_replace_editor", command="str_replace", path=path, old_str=fix_old,
             new_str=fix_new) + "\n" + call("bash", command="python -m pytest -q")[:-12],
        call("bash", command="python -m pytest -q -p no:cacheprovider"),
        call("submit"),
    ]
    def with_scaffold(timeout_s: float) -> dict:
        return {**task, "data": {**json.loads(task["data"]), "scaffold": {
            "command_timeout_s": timeout_s, "max_observation_chars": 2000}}}

    # Only the `sleep 30` step runs under a 1 s command timeout: the others (pytest among them)
    # get a bound no busy machine reaches, so the test does not depend on an idle CPU.
    sleep_step = completions.index(call("bash", command="sleep 30"))
    score, obs, state = asyncio.run(play(with_scaffold(120), completions,
                                         step_tasks={sleep_step: with_scaffold(1)}))
    expected = [
        "No tool call found", "could not read the tool call: invalid JSON",
        "unknown tool 'rm_rf'", "/testbed/tests/test_wordwrap.py", "Lines 4-6",
        "file already exists", "did not appear verbatim", "occurs 6 times",
        "insert_line 999 is out of range", "missing required argument 'path'",
        "[exit code 3]", "timed out after 1 s", "characters omitted", "has been edited",
        "Last edit to /testbed/wordwrap.py undone", "2 passed",
        "2 passed",
    ]
    for observation, want in zip(obs, expected, strict=False):
        assert observation is not None and want in observation, (want, observation)
    assert len(obs) == len(completions) and obs[-1] is None
    assert obs[15].count("<tool_response>") == 2
    assert (score.reward, score.failure_class) == (1.0, "ok"), score.verifier
    assert "+    if current:" in state["patch"]


@needs_bwrap
def test_an_episode_resumed_in_another_process_continues_its_workspace(
        sandbox_root: Path) -> None:
    task = shipped("semver")[0]
    path = "/testbed/semver.py"
    old = 'left, right = a.split("."), b.split(".")'

    async def two_processes():
        first = SweEnv()
        state = await first.reset(task)
        step = await first.step(task, state, call(
            "str_replace_editor", command="str_replace", path=path, old_str=old,
            new_str="left = [int(p) for p in a.split('.')]\n    right = "
                    "[int(p) for p in b.split('.')]"))
        checkpoint = json.loads(json.dumps(step.state))  # what RUN writes to Kafka
        await first.close(task, step.state)  # the process goes away with its sandbox
        # Another process: nothing live here; the state rebuilds the workspace.
        assert checkpoint["sandbox"] not in SweEnv._live
        return await play(task, [
            call("bash", command="grep -c 'int(p)' semver.py"),
            call("str_replace_editor", command="undo_edit", path=path),
            call("str_replace_editor", command="undo_edit", path=path),  # nothing left
            call("bash", command="git apply <<'EOF'\n" + SweInstance.from_task(task)
                 .gold_patch + "EOF"),
            call("submit")], state=checkpoint)

    score, obs, state = asyncio.run(two_processes())
    assert obs[0].splitlines()[1] == "2"  # the edit made before the "crash" is there
    assert "undone" in obs[1] and "no edit to undo" in obs[2]
    assert (score.reward, score.failure_class) == (1.0, "ok"), score.verifier


@needs_bwrap
def test_no_submit_and_token_budget_are_scored_as_the_agents_doing(sandbox_root: Path) -> None:
    task = shipped("chunks")[0]
    score, _, _ = asyncio.run(play(task, [call("bash", command="true")]))
    assert (score.reward, score.failure_class) == (0.0, "agent")
    assert score.verifier["reason"] == "no submit"
    tight = {**task, "data": {**json.loads(task["data"]),
                              "scaffold": {"max_total_tokens": len(task["prompt"]) + 50}}}
    score, obs, state = asyncio.run(play(tight, [call("bash", command="seq 1 1000")] * 3))
    assert state["exit"] == "token budget" and obs[-1] is None
    assert (score.reward, score.failure_class) == (0.0, "truncated")


def test_no_sandbox_is_an_infra_failure_without_a_reward(sandbox_root: Path,
                                                          monkeypatch) -> None:
    monkeypatch.setenv(backends.BACKEND_ENV, "docker")
    if backends.unavailable("docker") is None:  # an engine, but an image it cannot start
        monkeypatch.setenv(IMAGE_ENV, "rollstream/no-such-image:0")
        reason = "cannot start a container"
    else:
        reason = "no sandbox backend"
    task = shipped("stack")[0]
    score, obs, state = asyncio.run(play(task, [call("submit")]))
    assert obs == [None] and state["failure"]["class"] == "infra"
    assert score.reward is None and score.failure_class == "infra"
    assert reason in score.verifier["reason"]
    instance = SweInstance.from_task(task)
    graded = asyncio.run(grade(instance, instance.gold_patch))
    assert (graded.reward, graded.failure_class) == (None, "infra")


@needs_bwrap
def test_a_snapshot_that_does_not_build_its_base_commit_is_an_env_failure(
        sandbox_root: Path) -> None:
    task = shipped("median")[0]
    data = json.loads(task["data"])
    data["snapshot"]["stats.py"] += "\n# changed\n"
    score, _, state = asyncio.run(play({**task, "data": data}, [call("submit")]))
    assert state["failure"]["class"] == "env" and "base_commit" in state["failure"]["detail"]
    assert (score.reward, score.failure_class) == (None, "env")
