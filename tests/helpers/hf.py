"""transformers, imported by the tests that use it when they run, not when the suite is
collected: importing its model and tokenizer classes takes about 10 s of CPU beyond torch's,
which every worker paid at collection though only one or two run such a test."""

from __future__ import annotations

from types import ModuleType


def transformers() -> ModuleType:
    import transformers as module

    return module
