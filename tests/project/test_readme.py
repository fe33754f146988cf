"""The README starts where a newcomer starts, and every relative link in the docs leads somewhere.

Links and headings are read with markdown-it-py (the CommonMark parser rich renders Markdown
with), so a link inside a code block or inline code is not taken for one.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted([README, ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
FIRST_SCREEN = 60  # lines
MD = MarkdownIt("commonmark")


def _tokens(path: Path) -> list[Token]:
    return MD.parse(path.read_text())


def _links(markdown: str) -> list[str]:
    """The relative link targets in `markdown`, in order (no scheme: not http, not mailto)."""
    hrefs = [child.attrGet("href") for token in MD.parse(markdown) if token.type == "inline"
             for child in token.children or [] if child.type == "link_open"]
    return [str(href) for href in hrefs if href and not urlsplit(str(href)).scheme]


def _relative_links(path: Path) -> list[str]:
    return _links(path.read_text())


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    tokens = _tokens(path)
    headings = [tokens[i + 1] for i, t in enumerate(tokens) if t.type == "heading_open"]
    # The text GitHub slugs is the rendered one: code spans and link texts, no markup.
    texts = ["".join(c.content for c in h.children or [] if c.type in ("text", "code_inline"))
             for h in headings]
    return {_slug(text) for text in texts}


def _target(source: Path, href: str) -> tuple[Path, str]:
    parts = urlsplit(href)
    path = (source.parent / unquote(parts.path)).resolve() if parts.path else source
    return path, parts.fragment


def test_the_first_screen_has_the_diagram_the_prerequisites_and_both_commands() -> None:
    head = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    # The drawing of the topic graph (tests/contracts/test_graph.py checks it against the graph) is
    # the first code block, and it is closed within the first screen.
    blocks = [t for t in MD.parse(head) if t.type == "fence"]
    assert blocks, "no code block in the README's first lines"
    diagram = blocks[0].content
    for node in ("[INIT]", "[RUN]", "[EVAL]", "<p>.tasks", "<p>.scored", "<p>.policy"):
        assert node in diagram, node
    # Prerequisites: the Python the package declares, and what the broker needs.
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    python = re.fullmatch(r">=\s*(\d+\.\d+)", requires)
    assert python, requires
    for prerequisite in (f"Python {python[1]}+", "Java 17+", "Maven", "Linux"):
        assert prerequisite in head, prerequisite
    # What `make demo` installs by itself, and what `make test` installs besides.
    for installed in ("`.venv`", "jars", "`make deps`", "bubblewrap", "Docker engine",
                      "Prometheus", "docker-compose", "mini-swe-agent", "swebench"):
        assert installed in head, installed
    # Both commands, and both are targets of the Makefile: `make demo` in a block to copy (the
    # doc tests run it), `make test` named in the text (a block of it would run the suite inside
    # the suite).
    commands = "".join(b.content for b in blocks[1:])
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^make demo\b", commands, re.M), "`make demo` not shown in a block"
    assert "`make test`" in head, "`make test` not named"
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"no `{target}` target in the Makefile"
    # What the demo shows.
    for shown in ("mean reward per policy version", "summary", "PNG plot"):
        assert shown in head, shown


def test_measured_times_live_below_the_first_screen() -> None:
    """Numbers that change with each measurement have their section further down; the first
    screen says what Rollstream is and how to start it, and links there."""
    lines = README.read_text().splitlines()
    head, rest = "\n".join(lines[:FIRST_SCREEN]), "\n".join(lines[FIRST_SCREEN:])
    timing = re.compile(r"\b\d+(?:-\d+)? s\b")
    assert not timing.findall(head), timing.findall(head)
    assert "(#measured-set-up-and-the-demo)" in head
    assert "measured-set-up-and-the-demo" in _anchors(README)
    assert re.search(r"`make demo` took \d+ s", rest)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(doc: Path) -> None:
    broken = []
    for href in _relative_links(doc):
        path, fragment = _target(doc, href)
        if not path.exists():
            broken.append(f"{href}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
            broken.append(f"{href}: no heading #{fragment} in {path.relative_to(ROOT)}")
    assert not broken, broken


def test_every_doc_is_reachable_from_the_readme() -> None:
    reached, todo = {README}, [README]
    while todo:
        source = todo.pop()
        for href in _relative_links(source):
            path, _ = _target(source, href)
            if path.suffix == ".md" and path.exists() and path not in reached:
                reached.add(path)
                todo.append(path)
    unreached = [str(p.relative_to(ROOT)) for p in DOCS if p not in reached]
    assert not unreached, unreached


def test_the_link_reader_sees_links_and_skips_code() -> None:
    """The checks above would pass vacuously if the reader found no links."""
    text = ("See [a](docs/a.md#x), [web](https://example.org) and `[b](b.md)`.\n\n"
            "```python\nx = y[0](z)\n[c](c.md)\n```\n\n- [d](../d.md)\n")
    assert _links(text) == ["docs/a.md#x", "../d.md"]
    assert "docs/concepts.md" in _relative_links(README)
    assert _slug("Any agent harness: the OpenAI-compatible gateway") == (
        "any-agent-harness-the-openai-compatible-gateway")
    assert _slug("scaling: episodes/s as RUN and EVAL processes are added") == (
        "scaling-episodess-as-run-and-eval-processes-are-added")
