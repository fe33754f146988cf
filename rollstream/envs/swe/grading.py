"""EVAL for SWE tasks: apply the agent's patch in a fresh sandbox and run the task's tests.

Steps (SWE-bench's harness, in a sandbox of any backend): build the repository; apply the model
patch (git apply, then --3way, then patch --fuzz); put back, as at the base commit, what the
patch may not touch (`protected_files`: the test patch's files, every conftest.py, pytest.ini,
tox.ini, setup.cfg, pyproject.toml; a patch touching .git is refused), then apply the test
patch; run the test command on the test directives. pytest runs write a JUnit report outside
the workspace and statuses come from it (junit.py), so lines the code under test prints cannot
pass as results; other runners' logs go through their log parser. Resolved means every
FAIL_TO_PASS and every PASS_TO_PASS test passes, by SWE-bench's rules (a skipped PASS_TO_PASS
test is no regression; a listed id cut inside its parameters stands for the tests it begins),
checked against its own grading in tests/envs/test_swebench_contract.py; or, for tasks that give
expected statuses, every listed test has its expected status.

What is still in reach: the agent's own source runs inside the test process, so it could
rewrite pytest's internals at import time; the restored files and the report close the easy
ways (a conftest hook, printed lines), not that one.

Outcomes: resolved → reward 1, "ok"; tests ran but not resolved → 0, "ok"; empty patch or a
patch that does not apply → 0, "agent"; the task's own setup or test patch fails → "env";
the sandbox fails → "infra" (neither with a reward).
"""

from __future__ import annotations

import posixpath
import shlex
import uuid
from dataclasses import dataclass
from pathlib import PurePosixPath

from rollstream.envs.base import Score, agent_failure, process_sandboxes
from rollstream.envs.swe import workspace
from rollstream.envs.swe.instance import SweInstance, patch_files
from rollstream.envs.swe.junit import JUNIT_OPTIONS, parse_junit
from rollstream.envs.swe.log_parsers import PASSING, get_parser
from rollstream.envs.swe.workspace import WorkspaceError
from rollstream.sandbox import (
    HARNESS_TIMEOUT_S,
    ExecResult,
    Sandbox,
    SandboxError,
    Sandboxes,
    SandboxSpec,
)

LOG_BYTES = 4 << 20  # test logs: the summary is at the end, so the tail is kept
REPORT_BYTES = 16 << 20
PROTECTED_NAMES = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg",
                             "pyproject.toml"})


def resolution(instance: SweInstance, statuses: dict[str, str]) -> dict[str, list[str]]:
    """Which required tests failed, as SWE-bench's grading decides: absent counts as failed; a
    skipped FAIL_TO_PASS test fails, a skipped PASS_TO_PASS one is kept (no regression)."""
    if instance.expected_statuses:
        return {"mismatched": [t for t, want in instance.expected_statuses.items()
                               if statuses.get(t) != want]}
    return {"FAIL_TO_PASS": [t for t in instance.fail_to_pass
                             if _status(t, statuses) not in PASSING],
            "PASS_TO_PASS": [t for t in instance.pass_to_pass
                             if _status(t, statuses) not in PASSING | {"SKIPPED"}]}


def _status(test: str, statuses: dict[str, str]) -> str | None:
    """The status of `test`. SWE-bench's lists hold ids cut inside their parameters (e.g.
    `test_grammar[log(photon`): such an id takes the status of the tests it begins, when they
    agree on passing or not (SWE-bench's own rule)."""
    if test in statuses:
        return statuses[test]
    if test.count("[") > test.count("]"):
        found = [status for name, status in statuses.items() if name.startswith(test)]
        if found and len({status in PASSING for status in found}) == 1:
            return found[0]
    return None


def sandbox_spec(instance: SweInstance, **labels: str) -> SandboxSpec:
    return SandboxSpec(image=instance.image, labels={"task": instance.instance_id, **labels})


async def grade(instance: SweInstance, patch: str, sandboxes: Sandboxes | None = None) -> Score:
    """Score `patch` (the agent's diff) against the task's tests, in a sandbox from `sandboxes`
    (None: the process's settings)."""
    if not patch.strip():
        return agent_failure("empty patch")
    run = await run_tests(instance, patch, sandboxes)
    if isinstance(run, Score):
        return run
    failing = resolution(instance, run.statuses)
    resolved = not any(failing.values())
    verifier = {"resolved": resolved, "apply": run.applied, "failing": failing,
                "tests_run": len(run.statuses), "exit_code": run.output.exit_code,
                "timed_out": run.output.timed_out, "statuses_from": run.source,
                "restored": run.restored}
    if not run.statuses:
        verifier["log_tail"] = run.output.text[-2000:]
    return Score(1.0 if resolved else 0.0, "ok", verifier)


@dataclass(frozen=True)
class SuiteRun:
    """What the task's tests did on a patch: their output, and the statuses graded."""

    output: ExecResult
    statuses: dict[str, str]
    source: str  # "junit" (pytest's report) or "log" (the task's log parser)
    applied: str  # the command that applied the patch
    restored: list[str]  # files put back as at the base commit


async def run_tests(instance: SweInstance, patch: str,
                    sandboxes: Sandboxes | None = None) -> SuiteRun | Score:
    """Run the task's tests on `patch` in a fresh sandbox from `sandboxes` (None: the process's
    settings); a Score when they could not run (the patch is refused or does not apply, the
    task or the sandbox failed)."""
    try:
        sandbox = await (sandboxes or process_sandboxes()).create(
            sandbox_spec(instance, stage="eval"))
    except SandboxError as exc:
        return Score(None, "infra", {"reason": f"sandbox: {exc}"})
    try:
        return await _run_in(sandbox, instance, patch)
    except SandboxError as exc:
        return Score(None, "infra", {"reason": f"sandbox: {exc}"})
    except WorkspaceError as exc:
        return Score(None, "env", {"reason": str(exc)})
    finally:
        await sandbox.destroy()


def protected_files(instance: SweInstance, patch: str) -> list[str]:
    """Files put back as at the base commit before the tests run, whatever the patch did to
    them: the test patch's files, and test configuration that could change how results are
    reported (conftest.py anywhere, pytest.ini, tox.ini, setup.cfg, pyproject.toml)."""
    touched = [p for p in patch_files(patch) if posixpath.basename(p) in PROTECTED_NAMES]
    return list(dict.fromkeys([*patch_files(instance.test_patch), *touched]))


def _uses_junit(instance: SweInstance) -> bool:
    return instance.log_parser == "pytest" and "pytest" in instance.test_cmd


async def _run_in(sandbox: Sandbox, instance: SweInstance, patch: str) -> SuiteRun | Score:
    if any(".git" in PurePosixPath(p).parts for p in patch_files(patch)):
        return agent_failure("the patch touches .git")
    base = await workspace.prepare(sandbox, instance)
    applied = await workspace.apply_patch(sandbox, patch, base, "model")
    if not applied.applied:
        return agent_failure("patch does not apply", log=applied.log[-4000:])
    restore = protected_files(instance, patch)
    if restore:
        quoted = " ".join(shlex.quote(t) for t in restore)
        await sandbox.exec(f"for f in {quoted}; do if git cat-file -e {base}:\"$f\" 2>/dev/null; "
                           f"then git checkout -q {base} -- \"$f\"; else rm -f -- \"$f\"; fi; "
                           "done; true", timeout_s=HARNESS_TIMEOUT_S)
    if instance.test_patch:
        test_apply = await sandbox.exec(["git", "apply", "--verbose", "-"],
                                        stdin=instance.test_patch.encode(),
                                        timeout_s=HARNESS_TIMEOUT_S)
        if not test_apply.ok:
            raise WorkspaceError(f"the test patch does not apply: {test_apply.text.strip()}")
    directives = " ".join(shlex.quote(d) for d in instance.directives)
    command = f"{instance.test_cmd} {directives}"
    report = f"/tmp/.rollstream-report-{uuid.uuid4().hex}.xml"
    if _uses_junit(instance):
        command = f"{instance.test_cmd} {JUNIT_OPTIONS.format(path=report)} {directives}"
    run = await sandbox.exec(command, timeout_s=instance.eval_timeout_s, output_bytes=LOG_BYTES)
    source = "log"
    if _uses_junit(instance):
        source = "junit"
        try:
            statuses = parse_junit(await sandbox.read_file(report, REPORT_BYTES))
        except (OSError, ValueError):  # no report (the run was killed, or broke pytest): none ran
            statuses = {}
    else:
        statuses = get_parser(instance.log_parser)(run.text)
    return SuiteRun(run, statuses, source, applied.command, restore)
