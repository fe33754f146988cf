"""Test statuses from pytest's JUnit XML report, keyed by the test ids SWE-bench uses.

EVAL reads statuses from this report rather than from the test log: anything the code under
test prints (an atexit hook printing `PASSED tests/...` after the summary, a test echoing
summary lines) lands in the log, never in the report's verdicts. The report is written by
pytest to a path outside the workspace, named at random per run.

pytest's `xunit1` family records each test's file; with its classname this gives back the node
id (`tests/test_a.py::TestCase::test_x[param]`). SWE-bench's ids are the first word of that id
(its log parser splits summary lines on whitespace, so `test_ids[a b]` is known there as
`test_ids[a`): the same cut is made here so task lists written by SWE-bench match. Skipped
tests are left out, as from the log (`pytest -rA` sums skips up by location, naming no test),
so a skipped test is graded as SWE-bench grades it: missing.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

JUNIT_OPTIONS = "-o junit_family=xunit1 --junitxml={path}"


def _node_id(case: ET.Element) -> str:
    name = case.get("name", "")
    file = case.get("file")
    classname = case.get("classname", "")
    if not file:
        return "::".join(part for part in (*classname.split("."), name) if part)
    module = file.removesuffix(".py").replace("/", ".")
    classes = classname[len(module) + 1:] if classname.startswith(module + ".") else ""
    return "::".join([file, *(c for c in classes.split(".") if c), name])


def _status(case: ET.Element) -> str | None:
    if case.find("failure") is not None:
        return "FAILED"
    if case.find("error") is not None:
        return "ERROR"
    skipped = case.find("skipped")
    if skipped is not None:
        return "XFAIL" if skipped.get("type") == "pytest.xfail" else None
    return "PASSED"


def parse_junit(xml: bytes) -> dict[str, str]:
    """{SWE-bench test id: PASSED | FAILED | ERROR | XFAIL} (skipped tests left out); raises
    ValueError on a document that is not a JUnit report."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise ValueError(f"not a JUnit XML report: {exc}") from None
    statuses: dict[str, str] = {}
    for case in root.iter("testcase"):
        words = _node_id(case).split()
        status = _status(case)
        if words and status is not None:
            statuses[words[0]] = status
    return statuses
