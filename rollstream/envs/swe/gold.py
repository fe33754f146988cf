"""A task's gold patch as a script of tool calls, what a perfect agent would send: one
str_replace_editor call per hunk (create for new files, bash `rm` for deleted ones), then
submit. The scripted policy replays it to test the whole loop (parsing, tools, diff, EVAL)
without a model. When a hunk's old text is not unique in the file (so str_replace would
refuse it), the whole patch goes through `git apply` in one bash call instead."""

from __future__ import annotations

import re
import shlex

from rollstream.contracts.tool_calls import ToolCall, hermes
from rollstream.envs.swe.instance import SweInstance

_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)\n(.*?)(?=^diff --git |\Z)", re.M | re.S)
_HUNK = re.compile(r"^@@ [^\n]*@@[^\n]*\n(.*?)(?=^@@ |\Z)", re.M | re.S)


def _hunk_texts(body: str) -> tuple[str, str]:
    old, new = [], []
    for line in body.split("\n"):
        if line.startswith("\\"):  # "\ No newline at end of file"
            continue
        tag, text = line[:1], line[1:]
        if tag in (" ", "-"):
            old.append(text)
        if tag in (" ", "+"):
            new.append(text)
    return "\n".join(old), "\n".join(new)


def patch_calls(patch: str, workdir: str, files: dict[str, str] | None) -> list[ToolCall]:
    """Tool calls that turn the repository into `patch` applied (`files`: its contents)."""
    calls: list[ToolCall] = []
    for _, path, section in _FILE.findall(patch):
        target = f"{workdir}/{path}"
        if "\n+++ /dev/null" in section or section.startswith("deleted file"):
            calls.append(ToolCall("bash", {"command": f"rm {shlex.quote(path)}"}))
            continue
        hunks = [_hunk_texts(h.rstrip("\n")) for h in _HUNK.findall(section)]
        if "--- /dev/null" in section:
            calls.append(ToolCall("str_replace_editor", {
                "command": "create", "path": target, "file_text": hunks[0][1] + "\n"}))
            continue
        content = (files or {}).get(path)
        if content is None or any(content.count(old) != 1 for old, _ in hunks):
            heredoc = f"git apply <<'ROLLSTREAM_PATCH'\n{patch}ROLLSTREAM_PATCH"
            return [ToolCall("bash", {"command": heredoc})]
        for old, new in hunks:
            calls.append(ToolCall("str_replace_editor", {
                "command": "str_replace", "path": target, "old_str": old, "new_str": new}))
    return calls


def gold_script(instance: SweInstance, workdir: str = "/testbed") -> list[str]:
    """Completion texts, one per turn: the gold patch as tool calls, then submit."""
    calls = patch_calls(instance.gold_patch, workdir, instance.snapshot)
    return [hermes(call) for call in [*calls, ToolCall("submit", {})]]


def submit_only_script() -> list[str]:
    """An agent that changes nothing and submits at once."""
    return [hermes(ToolCall("submit", {}))]
