"""Every shell and Python block of README.md and docs/*.md, run as pasted (tests/docs/blocks.py),
and the rule for the blocks marked as not run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sybil import Example
from sybil.evaluators.skip import Skipper

from tests.docs.blocks import (
    PAGES,
    ROOT,
    TEST_PATH,
    TRAINER_PAGES,
    Pages,
    blocks,
    mark_reason,
    parse,
)

# A page's blocks run in order, in one worker: the whole module goes to one (--dist loadfile).
pytestmark = pytest.mark.timeout(900)

_PAGES = Pages(Path())  # the working area is set by the `pages` fixture
_DOCUMENTS = [parse(path, _PAGES) for path in PAGES]


def _params() -> Iterator[object]:
    """One test per code block, in page order; a block marked as not run skips with its
    reason (the directive is read here, so selecting one block with -k still honours it)."""
    for document in _DOCUMENTS:
        name = str(Path(document.path).relative_to(ROOT))
        reason = None
        for example in document:
            if isinstance(example.region.evaluator, Skipper):
                reason = mark_reason(example)
                continue
            marks = [pytest.mark.trainers] if name in TRAINER_PAGES else []
            if reason is not None:
                marks.append(pytest.mark.skip(reason=reason))
            yield pytest.param(example, id=f"{name}:{example.line}", marks=marks)
            reason = None


@pytest.fixture(scope="module")
def pages(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    _PAGES.tmp = tmp_path_factory.mktemp("pages")
    yield _PAGES
    _PAGES.close(bootstrap)


@pytest.mark.parametrize("example", list(_params()))
def test_block(pages: Pages, example: Example) -> None:
    example.evaluate()


def test_marked_blocks_name_their_test_and_stay_under_a_tenth() -> None:
    found = list(blocks())
    marked = [b for b in found if b.marked is not None]
    assert len(found) >= 20, found  # the pages were parsed
    for block in marked:
        named = TEST_PATH.findall(block.marked or "")
        assert named, f"{block.page}:{block.line}: the mark names no test: {block.marked!r}"
        for path in named:
            assert (ROOT / path).is_file(), f"{block.page}:{block.line}: {path} is not there"
    assert len(marked) * 10 <= len(found), (
        f"{len(marked)} of {len(found)} blocks are marked as not run (at most a tenth): "
        + ", ".join(f"{b.page}:{b.line}" for b in marked))
