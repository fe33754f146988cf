"""The documentation's code blocks as tests: README.md and docs/*.md parsed with Sybil.

Shell blocks (```bash, ```sh, ```shell) run as a stranger pastes them into one terminal: each with
`bash -euo pipefail` in a process group of its own, in the page's working directory (a temporary
one holding links to the checkout's top-level files, so `examples/...` and `make` work and what a
block writes stays out of the checkout), with the project's `.venv/bin` on PATH. What a block
exports and the directory it ends in carry to the page's next block, as in a terminal; every
process the block left running in its group (the `&` jobs) is stopped when it ends. Python blocks
run in one namespace per page, as pasted into one interpreter. Other fences (```text, ```toml,
...) are not code.

A block that cannot run here is marked in the Markdown, on the line before it:
`<!-- skip: next "needs a GPU: tests/inference/test_x.py runs the same commands" -->`
(Sybil's skip directive): the reason, and the test that exercises the same commands.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sybil import Document, Example
from sybil.evaluators.python import PythonEvaluator
from sybil.evaluators.skip import Skipper
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = ("bash", "sh", "shell")
# Pages whose blocks need the pinned trainers (`make trainer-deps`): run in the trainers' session.
TRAINER_PAGES = {"docs/training.md"}
# Pages that start or stop brokers of their own (the secured one, a 3-node cluster, `broker
# stop`): a ROLLSTREAM_HOME of their own, so they start from a fresh home as a new user's would
# and never touch the session's broker.
OWN_HOME_PAGES = {"docs/security.md", "docs/operations.md"}
BLOCK_TIMEOUT_S = 600.0
STOP_GRACE_S = 15.0
# Where a marked block's reason names the test that runs the same commands.
TEST_PATH = re.compile(r"tests/[\w/]+\.py")


@dataclass
class Page:
    """One page's terminal: its working directory, environment and topic prefix."""

    name: str
    workdir: Path
    env: dict[str, str]
    prefix: str
    own_home: Path | None = None
    cwd: Path = field(init=False)
    outputs: list[str] = field(default_factory=list)  # each shell block's, in order
    started: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.cwd = self.workdir


def page_name(example: Example) -> str:
    return str(Path(example.path).relative_to(ROOT))


def new_page(name: str, tmp: Path) -> Page:
    """A fresh terminal for page `name`: a working directory linking the checkout's files, the
    environment of a new shell with the virtualenv on PATH, and a topic prefix of its own
    (ROLLSTREAM_PREFIX), so pages never share topics. No broker is named: a page names it."""
    # A block's `make venv` would reinstall a stale virtualenv through the link, and the
    # reinstalled scripts would name the temporary folder's interpreter.
    stamp, project = ROOT / ".venv" / ".installed-core", ROOT / "pyproject.toml"
    if stamp.is_file() and stamp.stat().st_mtime < project.stat().st_mtime:
        raise AssertionError("pyproject.toml is newer than .venv: `make test-venv` first")
    workdir = tmp / "work"
    workdir.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "__pycache__"):
            (workdir / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KAFKA_", "ROLLSTREAM_", "PYTEST_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    prefix = f"doc{uuid.uuid4().hex[:8]}"
    env["ROLLSTREAM_PREFIX"] = prefix
    env["HOME"] = os.environ.get("HOME", str(tmp))
    own_home = None
    if name in OWN_HOME_PAGES:
        own_home = tmp / "home"
        env["ROLLSTREAM_HOME"] = str(own_home)
    return Page(name, workdir, env, prefix, own_home)


def run_shell(page: Page, source: str, label: str, timeout: float = BLOCK_TIMEOUT_S) -> str:
    """Run one shell block in `page`'s terminal; its output, or AssertionError with its tail."""
    state = Path(tempfile.mkdtemp(prefix="block-", dir=page.workdir.parent))
    script = state / "block.sh"
    # The trap records what the block exported and where it ended, for the page's next block.
    script.write_text(
        f"trap 'env -0 > {state}/env; pwd > {state}/cwd' EXIT\n" + source)
    out = state / "out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(["bash", "-euo", "pipefail", str(script)], cwd=page.cwd,
                                env=page.env, stdin=subprocess.DEVNULL, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            left = stop_group(proc.pid)
    text = out.read_text(errors="replace")
    if rc is None:
        raise AssertionError(f"{label} ran past {timeout:.0f} s; its output:\n{text[-6000:]}")
    if rc != 0:
        raise AssertionError(f"{label} exited {rc}; its output:\n{text[-6000:]}")
    if left:
        raise AssertionError(f"{label} left processes running after SIGKILL: {left}")
    if (state / "env").is_file():
        pairs = (item.split("=", 1) for item in
                 (state / "env").read_text().split("\0") if "=" in item)
        page.env = {k: v for k, v in pairs if k not in ("PWD", "OLDPWD", "SHLVL", "_")}
        page.cwd = Path((state / "cwd").read_text().strip())
    return text


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(pgid: int) -> list[int]:
    """Stop every process left in the block's group: SIGTERM (the services stop cleanly), then
    SIGKILL after a grace period. The pids still there after that (none, normally)."""
    if not _group_alive(pgid):
        return []
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        time.sleep(1)
    return _live_members(pgid)


def _live_members(pgid: int) -> list[int]:
    """Members of the group that are not zombies (a zombie waits for its reaper, harmlessly)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


class Pages:
    """Every page's terminal, made when its first block runs, cleaned up at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.pages: dict[str, Page] = {}

    def of(self, example: Example) -> Page:
        name = page_name(example)
        if name not in self.pages:
            self.pages[name] = new_page(name, self.tmp / name.replace("/", "_"))
        return self.pages[name]

    def close(self, bootstrap: str) -> None:
        from rollstream.cluster.topics import delete_topics
        from rollstream.config import load

        for page in self.pages.values():
            if page.own_home is not None:  # brokers the page started in its own home
                for extra in ([], ["--secure"]):
                    subprocess.run(["rollstream", "broker", "stop", *extra], env=page.env,
                                   cwd=page.workdir, capture_output=True, timeout=120)
            kafka = load(bootstrap_servers=bootstrap).kafka()
            delete_topics(kafka, page.prefix, whole_namespace=True)


def page_module(*names: str) -> tuple[Pages, list[Any]]:
    """For a test module of pages: their terminals (the `page` fixture sets them up and cleans
    up) and one pytest param per code block, page after page, in order. A block marked as not
    run skips with its reason (read here, so selecting one block with -k still honours it)."""
    import pytest

    pages = Pages(Path())
    params = []
    for name in names:
        params += _page_params(name, pages, pytest)
    return pages, params


def _page_params(name: str, pages: Pages, pytest: Any) -> list[Any]:
    params = []
    reason = None
    for example in parse(ROOT / name, pages):
        if isinstance(example.region.evaluator, Skipper):
            reason = mark_reason(example)
            continue
        marks = [pytest.mark.trainers] if name in TRAINER_PAGES else []
        if reason is not None:
            marks.append(pytest.mark.skip(reason=reason))
        params.append(pytest.param(example, id=f"{name}:{example.line}", marks=marks))
        reason = None
    return params


def shell_evaluator(pages: Pages) -> object:
    def evaluate(example: Example) -> None:
        page = pages.of(example)
        text = run_shell(page, str(example.parsed), f"{page.name}:{example.line}")
        page.outputs.append(text)  # for a page's own checks of what its blocks printed
        print(text)  # in the test's captured stdout (`pytest -rP` shows it)
    return evaluate


def python_evaluator(pages: Pages) -> object:
    """Python blocks in the page's namespace, in its working directory and environment."""
    plain = PythonEvaluator()

    def evaluate(example: Example) -> None:
        page = pages.of(example)
        saved_env, saved_cwd, saved_path = dict(os.environ), Path.cwd(), list(sys.path)
        os.environ.clear()
        os.environ.update(page.env)
        os.chdir(page.cwd)
        # As an interpreter started in that terminal: its PYTHONPATH first on the path.
        sys.path[:0] = [p for p in page.env.get("PYTHONPATH", "").split(os.pathsep) if p]
        try:
            plain(example)
        finally:
            sys.path[:] = saved_path
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
    return evaluate


def parse(path: Path, pages: Pages | None = None) -> Document:
    """`path` parsed: its skip directives, shell and Python blocks (evaluators need `pages`)."""
    shell = shell_evaluator(pages) if pages else None
    parsers = [SkipParser(), *(CodeBlockParser(language, shell) for language in SHELLS),
               PythonCodeBlockParser()]
    document = Document.parse(str(path), *parsers)
    if pages is not None:
        python = python_evaluator(pages)
        for _, region in document.regions:
            if isinstance(region.evaluator, PythonEvaluator):
                region.evaluator = python
    return document


def mark_reason(directive: Example) -> str:
    """The reason of a `<!-- skip: next "REASON" -->` directive (only that form is used)."""
    action, arguments = directive.parsed
    if action != "next" or not arguments:
        raise ValueError(f"{directive.path}:{directive.line}: write marks as "
                         '<!-- skip: next "why, and the test that runs the same commands" -->')
    # Sybil evaluates the reason as a Python expression: here, a string literal.
    return str(ast.literal_eval(arguments))


@dataclass
class Block:
    page: str
    line: int
    language: str
    marked: str | None  # the reason, when the block is marked as not run


def blocks() -> Iterator[Block]:
    """Every code block of every page, with its mark."""
    for path in PAGES:
        reason: str | None = None
        for example in parse(path):
            if isinstance(example.region.evaluator, Skipper):
                reason = mark_reason(example)
                continue
            language = example.region.lexemes.get("arguments") or "python"
            yield Block(str(path.relative_to(ROOT)), example.line, language, reason)
            reason = None


DOC_TEST = re.compile(r"tests/docs/test_\w+\.py::test_block\[(.*)\]$")


def summary_line(stats: dict[str, list[object]]) -> str | None:
    """`doc blocks: N run, M marked (page:line: reason; ...)` from a session's reports, or None
    when the session ran no doc block. A failed block counts as run (and fails the session)."""
    run, marked = 0, []
    for outcome in ("passed", "failed", "skipped"):
        for report in stats.get(outcome, []):
            found = DOC_TEST.match(getattr(report, "nodeid", ""))
            if found is None:
                continue
            where = found.group(1)
            if outcome == "skipped":
                longrepr = getattr(report, "longrepr", None)
                reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
                marked.append(f"{where}: {reason.removeprefix('Skipped: ')}")
            elif getattr(report, "when", "") == "call":
                run += 1
    if not run and not marked:
        return None
    return f"doc blocks: {run} run, {len(marked)} marked ({'; '.join(marked) or 'none'})"
