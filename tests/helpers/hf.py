"""transformers, imported by the tests that use it when they run, not when the suite is
collected: importing its model and tokenizer classes at collection cost every worker 7.7 s of
CPU (24.8 s to collect, 17.1 s without), though only one or two workers run such a test."""

from __future__ import annotations

from types import ModuleType


def transformers() -> ModuleType:
    import transformers as module

    return module
