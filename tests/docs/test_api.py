"""docs/api.md's code blocks, run as pasted (tests/docs/blocks.py)."""

from __future__ import annotations

import pytest
from sybil import Example

from tests.docs.blocks import page_module

PAGES, BLOCKS = page_module("docs/api.md")
pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("example", BLOCKS)
def test_block(page: object, example: Example) -> None:
    example.evaluate()
