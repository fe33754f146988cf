"""README.md's code blocks, run as pasted (tests/docs/blocks.py)."""

from __future__ import annotations

import re

import pytest
from sybil import Example

from rollstream.dev.loop import LoopConfig
from tests.docs.blocks import ROOT, page_module

PAGES, BLOCKS = page_module("README.md")
pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("example", BLOCKS)
def test_block(page: object, example: Example) -> None:
    example.evaluate()


def test_the_demo_block_learned_summarized_and_plotted() -> None:
    """What `make demo`, the README's first command block, printed and drew (the suite runs the
    demo once, as pasted: this is its check): every episode scored, the reward of the last fifth
    of episodes well above the first, later episodes sampled by later policy versions (the
    servers reloaded), one training sample per episode (the embedded template is append-only),
    and the PNG plot."""
    page = PAGES.pages.get("README.md")
    assert page is not None and page.outputs, "the README's `make demo` block did not run"
    out = page.outputs[0]
    expected = LoopConfig.tasks * LoopConfig.group_size
    assert f"{expected}/{expected}" in out, out[-3000:]
    for heading in ("mean reward by the policy version", "policy versions trained",
                    "per-stage latency"):
        assert heading in out, heading
    assert f"1.00 ({expected} in all)" in out
    fifths = re.search(r"(\d\.\d{3}) → (\d\.\d{3})", out)
    assert fifths is not None, out[-3000:]
    first, last = float(fifths[1]), float(fifths[2])
    assert first <= 0.3 and last >= 0.7, (first, last)
    # The reward table's rows: policy version, episodes, mean reward.
    versions = [int(v) for v in re.findall(r"│\s+(\d+) │\s+\d+ │\s+\d\.\d{3} │", out)]
    assert versions and max(versions) >= 10, versions
    plots = sorted((ROOT / ".rollstream" / "demo").glob("*/demo.png"),
                   key=lambda p: p.stat().st_mtime)
    assert plots and plots[-1].stat().st_mtime >= page.started, "no plot from this run"
    assert plots[-1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
