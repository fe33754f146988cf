"""What an RL policy could try against the `swe` environment, on each backend: commands
that never stop printing (in the bash tool and in EVAL's test run), forged test results (a
conftest.py that passes everything, lines printed after pytest's summary), a broken .git. Each
must end in bounded time with reward 0 and the class `agent` or `ok`, never `env` or `infra`.
SWE-bench's log parser's cuts are checked against its documented behaviour."""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import json
import time

import pytest

from rollstream.envs.swe.grading import grade, protected_files
from rollstream.envs.swe.instance import SweInstance
from rollstream.envs.swe.junit import parse_junit
from rollstream.envs.swe.log_parsers import parse_pytest
from tests.helpers.sandbox_helpers import backend, sandbox_root
from tests.helpers.swe_helpers import EDGE_LOG, call, play, shipped

__all__ = ["backend", "sandbox_root"]


def wordwrap() -> SweInstance:
    return SweInstance.from_task(shipped("wordwrap")[0])


def edit(instance: SweInstance, path: str, text: str) -> str:
    """A git patch that makes `path` hold `text` (a new file when the snapshot lacks it)."""
    assert instance.snapshot is not None
    old = instance.snapshot.get(path)
    lines = difflib.unified_diff((old or "").splitlines(keepends=True),
                                 text.splitlines(keepends=True),
                                 "/dev/null" if old is None else f"a/{path}", f"b/{path}")
    header = f"diff --git a/{path} b/{path}\n" + ("new file mode 100644\n" if old is None else "")
    return header + "".join(lines)


def appended(instance: SweInstance, path: str, extra: str) -> str:
    assert instance.snapshot is not None
    return edit(instance, path, instance.snapshot[path] + extra)


# -- runaway commands --------------------------------------------------------------------------

def test_the_bash_tool_returns_from_a_command_still_printing(backend: str) -> None:
    task = shipped("wordwrap")[0]
    fast = {**task, "data": {**json.loads(task["data"]),
                             "scaffold": {"command_timeout_s": 2}}}
    started = time.monotonic()
    score, observations, state = asyncio.run(play(fast, [
        call("bash", command="yes"), call("bash", command="base64 /dev/urandom"),
        call("bash", command="trap '' TERM; while :; do echo x; done"), call("submit")]))
    assert time.monotonic() - started < 3 * (2 + 10) + 60  # generous: setup and grading too
    assert all("timed out after 2 s" in o for o in observations[:3]), observations
    assert state["submitted"] and state["failure"] is None
    assert (score.reward, score.failure_class) == (0.0, "agent")  # nothing changed: empty


def test_a_patch_whose_tests_print_forever_gets_a_verdict(backend: str) -> None:
    instance = dataclasses.replace(wordwrap(), eval_timeout_s=3)
    patch = appended(instance, "wordwrap.py", "\nwhile True:\n    print('y' * 80)\n")
    started = time.monotonic()
    score = asyncio.run(grade(instance, patch))
    assert time.monotonic() - started < 3 + 10 + 60
    assert (score.reward, score.failure_class) == (0.0, "ok"), score.verifier
    assert score.verifier["timed_out"]


# -- forged results ----------------------------------------------------------------------------

PASS_EVERYTHING = """
import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome = "passed"
    report.longrepr = None
"""


@pytest.mark.parametrize("where", ["conftest.py", "tests/conftest.py"])
def test_a_conftest_that_passes_everything_earns_nothing(backend: str, where: str) -> None:
    instance = wordwrap()
    score = asyncio.run(grade(instance, edit(instance, where, PASS_EVERYTHING)))
    assert (score.reward, score.failure_class) == (0.0, "ok"), score.verifier
    assert where in score.verifier["restored"]
    assert score.verifier["failing"]["FAIL_TO_PASS"]


def test_results_printed_by_the_code_under_test_earn_nothing(backend: str) -> None:
    instance = wordwrap()
    lines = "".join(f"PASSED {t}\\n" for t in instance.fail_to_pass)
    forged = (f"\nimport atexit, sys\nsys.stdout.write('{lines}')\n"
              f"atexit.register(lambda: sys.stdout.write('{lines}'))\n")
    score = asyncio.run(grade(instance, appended(instance, "wordwrap.py", forged)))
    assert (score.reward, score.failure_class) == (0.0, "ok"), score.verifier
    assert score.verifier["statuses_from"] == "junit"
    assert set(score.verifier["failing"]["FAIL_TO_PASS"]) <= set(instance.fail_to_pass)
    assert score.verifier["failing"]["FAIL_TO_PASS"]
    # The same forged patch on top of the real fix still resolves: only the forgery is ignored.
    fixed = asyncio.run(grade(instance, instance.gold_patch))
    assert fixed.reward == 1.0, fixed.verifier


def test_what_the_patch_may_not_touch() -> None:
    instance = wordwrap()
    patch = "".join(edit(instance, p, "x\n") for p in (
        "conftest.py", "sub/conftest.py", "pytest.ini", "setup.cfg", "wordwrap.py"))
    restored = protected_files(instance, patch)
    assert set(restored) >= {"conftest.py", "sub/conftest.py", "pytest.ini", "setup.cfg",
                             "tests/test_wordwrap.py"}
    assert "wordwrap.py" not in restored


def test_a_patch_touching_git_metadata_is_refused(backend: str) -> None:
    instance = wordwrap()
    score = asyncio.run(grade(instance, edit(instance, ".git/hooks/post-checkout", "x\n")))
    assert (score.reward, score.failure_class) == (0.0, "agent")


# -- a broken repository -----------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    "rm -rf /testbed/.git",
    "printf '[core\\n\\tbroken' > /testbed/.git/config",
    "echo 'ref: refs/heads/nowhere' > .git/HEAD && rm -rf .git/objects",
], ids=["rm_git", "bad_config", "no_objects"])
def test_breaking_git_is_the_agents_failure(backend: str, command: str) -> None:
    task = shipped("wordwrap")[0]
    gold = SweInstance.from_task(task).gold_patch
    assert gold  # the agent fixed the bug, then broke the repository: still its failure
    score, observations, state = asyncio.run(play(task, [call("bash", command=command),
                                                         call("submit")]))
    assert state["failure"] is None, state["failure"]
    assert (score.reward, score.failure_class) == (0.0, "agent"), score.verifier
    assert "broken" in score.verifier["reason"]


# -- test ids as SWE-bench cuts them -----------------------------------------------------------


def test_log_parser_cuts_test_ids_as_swebench_does() -> None:
    assert parse_pytest(EDGE_LOG) == {
        "tests/a.py::test_ids[a": "PASSED", "tests/a.py::test_y": "FAILED",
        "tests/a.py::test_z": "XFAIL", "tests/a.py::test_e": "ERROR"}


def test_junit_report_gives_the_same_ids() -> None:
    xml = b"""<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
    <testcase classname="tests.test_a" name="test_ids[a b]" file="tests/test_a.py" line="3"/>
    <testcase classname="tests.test_a.TestK" name="test_m" file="tests/test_a.py" line="9">
      <failure message="boom">x</failure></testcase>
    <testcase classname="tests.test_a" name="test_x" file="tests/test_a.py" line="12">
      <skipped type="pytest.xfail" message="later"/></testcase>
    <testcase classname="tests.test_a" name="test_s" file="tests/test_a.py" line="14">
      <skipped type="pytest.skip" message="no"/></testcase>
    <testcase classname="tests.test_a" name="test_e" file="tests/test_a.py" line="16">
      <error message="fixture"/></testcase>
    </testsuite></testsuites>"""
    assert parse_junit(xml) == {  # the skipped test_s is left out, as from the log
        "tests/test_a.py::test_ids[a": "PASSED", "tests/test_a.py::TestK::test_m": "FAILED",
        "tests/test_a.py::test_x": "XFAIL", "tests/test_a.py::test_e": "ERROR"}
    with pytest.raises(ValueError, match="JUnit"):
        parse_junit(b"PASSED tests/test_a.py::test_x")
