"""Test logs → {test id: status}. Statuses are pytest's words: PASSED, FAILED, SKIPPED, ERROR,
XFAIL, XPASS. A test passes when its status is in PASSING (SWE-bench counts XFAIL as a pass).

PARSERS maps the name a task's `log_parser` field gives to a function; `register` adds one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Parser = Callable[[str], dict[str, str]]
PASSING = frozenset({"PASSED", "XFAIL"})
# SWE-bench's TestStatus: an XPASS line is not a status there, so it is not one here either.
_PYTEST_STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COUNT = re.compile(r"^\[\d+\]$")


def parse_pytest(log: str) -> dict[str, str]:
    """`pytest -rA` short summary lines: `PASSED tests/a.py::test_x`,
    `FAILED tests/a.py::test_y - AssertionError: ...`. Test ids are cut as SWE-bench's own
    parser cuts them (the line's second word: `test_ids[a b]` is `test_ids[a`), so task lists
    made by SWE-bench match; the `SKIPPED [2] tests/a.py:3: reason` summary names no test.
    Colour codes are dropped first (SWE-bench's runs have none)."""
    statuses: dict[str, str] = {}
    for line in _ANSI.sub("", log).split("\n"):
        if line.startswith(_PYTEST_STATUSES):
            if line.startswith("FAILED"):
                line = line.replace(" - ", " ")
            words = line.split()
            if len(words) > 1 and not (words[0] == "SKIPPED" and _COUNT.match(words[1])):
                statuses[words[1]] = words[0]
    return statuses


_DJANGO = re.compile(r"^(\w+) \(([\w.]+)\)(?:\n.*?)? \.\.\. ?(ok|OK|FAIL|ERROR|skipped.*|"
                     r"expected failure|unexpected success)$", re.M)
_DJANGO_STATUS = {"ok": "PASSED", "OK": "PASSED", "FAIL": "FAILED", "ERROR": "ERROR",
                  "expected failure": "XFAIL", "unexpected success": "XPASS"}


def parse_django(log: str) -> dict[str, str]:
    """Django's runtests.py at verbosity 2: `test_x (app.tests.Case) ... ok`; the test id is
    SWE-bench's `test_x (app.tests.Case)`."""
    statuses = {}
    for name, where, outcome in _DJANGO.findall(log):
        status = "SKIPPED" if outcome.startswith("skipped") else _DJANGO_STATUS[outcome]
        statuses[f"{name} ({where})"] = status
    return statuses


_SYMPY = re.compile(r"^(test_\w+)\s+(ok|F|E|f|s|X)$", re.M)
_SYMPY_STATUS = {"ok": "PASSED", "F": "FAILED", "E": "ERROR", "f": "XFAIL", "s": "SKIPPED",
                 "X": "XPASS"}


def parse_sympy(log: str) -> dict[str, str]:
    """sympy's bin/test --verbose: `test_x ok`, `test_y F`, `test_z E`."""
    return {name: _SYMPY_STATUS[code] for name, code in _SYMPY.findall(log)}


PARSERS: dict[str, Parser] = {"pytest": parse_pytest, "django": parse_django,
                              "sympy": parse_sympy}


def register(name: str, parser: Parser) -> None:
    """Add a parser for tasks whose `log_parser` is `name`."""
    if name in PARSERS:
        raise ValueError(f"log parser {name!r} is already registered")
    PARSERS[name] = parser


def get_parser(name: str) -> Parser:
    try:
        return PARSERS[name]
    except KeyError:
        raise KeyError(f"unknown log parser {name!r}; known: {', '.join(sorted(PARSERS))}")\
            from None
