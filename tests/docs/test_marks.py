"""The rule for the doc blocks marked as not run, and every page with code blocks tested."""

from __future__ import annotations

from tests.docs.blocks import ROOT, TEST_PATH, blocks


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


def test_every_page_with_code_blocks_has_its_test_module() -> None:
    modules = {m: m.read_text() for m in (ROOT / "tests" / "docs").glob("test_*.py")}
    for page in sorted({b.page for b in blocks()}):
        holders = [m.name for m, text in modules.items() if f'"{page}"' in text
                   and "page_module(" in text]
        assert len(holders) == 1, f"{page} has code blocks: one tests/docs module runs them, " \
                                  f"found {holders}"
