"""The pages whose blocks run pipelines on this machine with the ports a user's would use (the
embedded server's 8011, fixed metrics ports): operations.md, environments.md and jobs.md, one
after another in one module, so no two bind the same port at once (tests/docs/blocks.py)."""

from __future__ import annotations

import pytest
from sybil import Example

from tests.docs.blocks import page_module

PAGES, BLOCKS = page_module("docs/operations.md", "docs/environments.md", "docs/jobs.md")
pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("example", BLOCKS)
def test_block(page: object, example: Example) -> None:
    example.evaluate()
