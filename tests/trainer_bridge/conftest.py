"""Fixtures the trainer adapters' tests share."""

from __future__ import annotations

import pytest

from rollstream.dev import tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tiny_model.TinyModel:
    """The tiny local Qwen2, built once for each module that asks for it."""
    return tiny_model.build(tmp_path_factory.mktemp("tiny") / "m")
