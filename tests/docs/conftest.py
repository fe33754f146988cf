"""The `page` fixture of the doc-block modules (tests/docs/test_<page>.py): the pages'
terminals set up in a temporary folder, and cleaned up after their blocks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.docs.blocks import Pages


@pytest.fixture(scope="module")
def page(request: pytest.FixtureRequest, bootstrap: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pages]:
    pages: Pages = request.module.PAGES
    pages.tmp = tmp_path_factory.mktemp("page")
    try:
        yield pages
    finally:
        pages.close(bootstrap)
