"""The official SWE-bench harness as an independent check of ours, on the shipped SWE set's
test runs (gold patch: resolved; the tests alone: not): its pytest log parser reads from the
log what ours reads from it and from the JUnit report, and its grading gives ours' verdict.

The `swebench` package is not a dependency (it pulls in datasets, modal and more), and only its
parsers and grading are used here: `make swebench-deps` puts the package, without its
dependencies, and unidiff (which its parsers import) under .rollstream/swebench. Its
`swebench.harness` package imports the heavy parts on import, so the modules are loaded under
a bare stand-in for that package. Without the package the test is skipped, saying so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rollstream.envs.swe.grading import SuiteRun, resolution, run_tests
from rollstream.envs.swe.instance import SweInstance
from rollstream.envs.swe.log_parsers import parse_pytest
from tests.helpers.sandbox_helpers import needs_bwrap, sandbox_root
from tests.helpers.swe_helpers import EDGE_LOG, shipped

__all__ = ["sandbox_root"]

OFFICIAL = Path(os.environ.get("ROLLSTREAM_SWEBENCH_PATH") or
                Path(__file__).resolve().parents[2] / ".rollstream" / "swebench")


@pytest.fixture(scope="module")
def official() -> Any:
    """The official parsers and grading modules, as one namespace."""
    if not (OFFICIAL / "swebench" / "harness").is_dir():
        pytest.skip(f"the official swebench package is not under {OFFICIAL} "
                    "(`make swebench-deps` puts it there)")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(OFFICIAL))
        harness = types.ModuleType("swebench.harness")
        harness.__path__ = [str(OFFICIAL / "swebench" / "harness")]
        patch.setitem(sys.modules, "swebench.harness", harness)
        parsers = importlib.import_module("swebench.harness.log_parsers.python")
        grading = importlib.import_module("swebench.harness.grading")
    assert not {"datasets", "modal"} & set(sys.modules)  # only the light parts were loaded
    return types.SimpleNamespace(parse=parsers.parse_log_pytest, grading=grading)


async def _runs(instances: list[SweInstance]) -> list[tuple[SweInstance, str, SuiteRun]]:
    gate = asyncio.Semaphore(4)

    async def one(instance: SweInstance, which: str) -> tuple[SweInstance, str, SuiteRun]:
        async with gate:
            # The tests alone as the answer: they run, on unfixed code.
            run = await run_tests(instance, instance.gold_patch if which == "gold"
                                  else instance.test_patch)
        assert isinstance(run, SuiteRun), (instance.instance_id, which, run)
        return instance, which, run

    return await asyncio.gather(*(one(i, which) for i in instances
                                  for which in ("gold", "unfixed")))


def test_the_official_parser_reads_edge_cases_as_ours(official: Any) -> None:
    assert parse_pytest(EDGE_LOG) == official.parse(EDGE_LOG, None)


# (FAIL_TO_PASS, PASS_TO_PASS, statuses): skips, ids SWE-bench's lists cut inside their
# parameters, expected failures, missing tests.
GRADING_CASES = [
    (["f"], ["p"], {"f": "PASSED", "p": "SKIPPED"}),
    (["f"], ["p"], {"f": "SKIPPED", "p": "PASSED"}),
    (["f"], ["p"], {"f": "XFAIL"}),
    (["t[log(photon"], ["p"], {"t[log(photon)]": "PASSED", "t[log(photon) 2]": "XFAIL",
                               "p": "PASSED"}),
    (["t[log(photon"], ["p"], {"t[log(photon)]": "PASSED", "t[log(photon) 2]": "FAILED",
                               "p": "PASSED"}),
    (["f", "g"], ["p", "q"], {"f": "PASSED", "g": "ERROR", "p": "FAILED", "q": "PASSED"}),
]


@pytest.mark.parametrize("f2p, p2p, statuses", GRADING_CASES)
def test_the_official_grading_decides_edge_cases_as_ours(
        official: Any, f2p: list[str], p2p: list[str], statuses: dict[str, str]) -> None:
    instance = dataclasses.replace(SweInstance.from_task(shipped("wordwrap")[0]),
                                   fail_to_pass=f2p, pass_to_pass=p2p)
    report = official.grading.get_eval_tests_report(
        statuses, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    ours = resolution(instance, statuses)
    assert {name: report[name]["failure"] for name in ours} == ours
    assert (official.grading.get_resolution_status(report) == "RESOLVED_FULL") == \
        (not any(ours.values()))


@needs_bwrap
def test_the_official_parser_and_grading_agree_with_ours(official: Any,
                                                         sandbox_root: Path) -> None:
    instances = [SweInstance.from_task(t) for t in shipped()]
    assert len(instances) == 26
    grading = official.grading
    for instance, which, run in asyncio.run(_runs(instances)):
        log = run.output.text
        theirs = official.parse(log, None)
        where = (instance.instance_id, which)
        assert theirs, where  # the log has pytest's -rA summary
        assert parse_pytest(log) == theirs, where
        assert run.source == "junit" and run.statuses == theirs, where
        report = grading.get_eval_tests_report(theirs, {
            "FAIL_TO_PASS": instance.fail_to_pass, "PASS_TO_PASS": instance.pass_to_pass})
        status = grading.get_resolution_status(report)
        ours = not any(resolution(instance, run.statuses).values())
        assert (status == "RESOLVED_FULL") == ours == (which == "gold"), (where, status)
