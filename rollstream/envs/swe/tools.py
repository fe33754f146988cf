"""The scaffold's tools: `bash`, `str_replace_editor` (view, create, str_replace, insert,
undo_edit) and `submit`, as SWE-agent and OpenHands define them, run in the episode's sandbox.

Every file operation happens inside the sandbox (so a link in the workspace cannot reach the
host). Undo history lives in the episode state, capped in size, so an episode resumed in another
process can still undo. A bad call (unknown tool, missing argument, old_str not found) is an
error observation for the model, never an exception.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import Any

from rollstream.contracts.tool_calls import ToolCall
from rollstream.envs.swe.instance import ScaffoldConfig
from rollstream.sandbox import HARNESS_TIMEOUT_S, Sandbox

MAX_FILE_BYTES = 1 << 20  # the editor's limit: larger files are for bash
UNDO_BUDGET_CHARS = 200_000  # across all files; the oldest entries go first
SNIPPET_LINES = 4

# The tools' JSON schemas, as shown to the model (OpenAI function format).
TOOL_SCHEMAS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "bash",
        "description": "Run a bash command in /testbed (no network; long output is cut).",
        "parameters": {"type": "object", "required": ["command"], "properties": {
            "command": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "str_replace_editor",
        "description": "View, create and edit files. view: a file (with line numbers) or a "
                       "directory; create: a new file; str_replace: replace old_str, which must "
                       "occur exactly once, by new_str; insert: new_str after line insert_line; "
                       "undo_edit: revert the last edit of path.",
        "parameters": {"type": "object", "required": ["command", "path"], "properties": {
            "command": {"enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string", "description": "absolute, e.g. /testbed/pkg/mod.py"},
            "file_text": {"type": "string"}, "old_str": {"type": "string"},
            "new_str": {"type": "string"}, "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}}}}}},
    {"type": "function", "function": {
        "name": "submit",
        "description": "Finish: your changes to /testbed are the answer.",
        "parameters": {"type": "object", "properties": {}}}},
]


class ToolError(Exception):
    """A call the model got wrong; the message is its observation."""


@dataclass
class Outcome:
    observation: str
    submitted: bool = False


def _arg(call: ToolCall, name: str, kind: type, required: bool = True) -> Any:
    value = call.arguments.get(name)
    if value is None:
        if required:
            raise ToolError(f"{call.name}: missing required argument {name!r}")
        return None
    if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)  # models often quote numbers
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ToolError(f"{call.name}: argument {name!r} must be of type {kind.__name__}")
    return value


def _numbered(text: str, first: int = 1) -> str:
    return "\n".join(f"{n:6}\t{line}" for n, line in enumerate(text.split("\n"), first))


class Tools:
    """The tools of one episode step: its sandbox, its limits and (a copy of) its undo state."""

    def __init__(self, sandbox: Sandbox, config: ScaffoldConfig, undo: dict[str, list[str]]):
        self.sandbox = sandbox
        self.config = config
        self.undo = undo

    async def call(self, call: ToolCall) -> Outcome:
        handlers = {"bash": self.bash, "str_replace_editor": self.editor, "submit": self.submit}
        handler = handlers.get(call.name)
        if handler is None:
            return Outcome(f"Error: unknown tool {call.name!r}; the tools are "
                           f"{', '.join(handlers)}.")
        try:
            return await handler(call)
        except ToolError as exc:
            return Outcome(f"Error: {exc}")

    async def submit(self, call: ToolCall) -> Outcome:
        return Outcome("Submitted.", submitted=True)

    async def bash(self, call: ToolCall) -> Outcome:
        command = _arg(call, "command", str)
        timeout = self.config.command_timeout_s
        result = await self.sandbox.exec(command, timeout_s=timeout)
        text = result.text
        if result.timed_out:
            text += f"\n[the command timed out after {timeout:g} s and was killed]"
        elif result.exit_code != 0:
            text += f"\n[exit code {result.exit_code}]"
        return Outcome(text if text.strip() else "[no output]")

    # -- str_replace_editor ---------------------------------------------------------------------

    def _path(self, call: ToolCall) -> str:
        path = _arg(call, "path", str)
        return posixpath.normpath(posixpath.join(self.sandbox.workdir, path))

    async def _read(self, path: str) -> str:
        try:
            data = await self.sandbox.read_file(path, MAX_FILE_BYTES)
        except FileNotFoundError:
            raise ToolError(f"the path {path} does not exist") from None
        except IsADirectoryError:
            raise ToolError(f"{path} is a directory") from None
        except (ValueError, OSError) as exc:
            raise ToolError(str(exc)) from None
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise ToolError(f"{path} is not UTF-8 text; use bash for it") from None

    async def _write(self, path: str, text: str, previous: str | None) -> None:
        try:
            await self.sandbox.write_file(path, text.encode())
        except OSError as exc:
            raise ToolError(f"cannot write {path}: {exc}") from None
        if previous is not None:
            self.undo.setdefault(path, []).append(previous)
            self._trim_undo()

    def _trim_undo(self) -> None:
        while sum(len(t) for stack in self.undo.values() for t in stack) > UNDO_BUDGET_CHARS:
            oldest = next(p for p, stack in self.undo.items() if stack)
            self.undo[oldest].pop(0)
            if not self.undo[oldest]:
                del self.undo[oldest]

    async def editor(self, call: ToolCall) -> Outcome:
        command = _arg(call, "command", str)
        handlers = {"view": self._view, "create": self._create, "str_replace": self._replace,
                    "insert": self._insert, "undo_edit": self._undo}
        if command not in handlers:
            raise ToolError(f"str_replace_editor: unknown command {command!r}; use one of "
                            f"{', '.join(handlers)}")
        return Outcome(await handlers[command](call, self._path(call)))

    async def _view(self, call: ToolCall, path: str) -> str:
        listing = await self.sandbox.exec(
            f"test -d {shlex.quote(path)} && find {shlex.quote(path)} -maxdepth 2 "
            f"-not -path '*/.*' | sort", timeout_s=HARNESS_TIMEOUT_S)
        if listing.ok:
            return f"Files and directories up to 2 levels deep in {path}:\n{listing.text}"
        text = await self._read(path)
        view_range = call.arguments.get("view_range")
        if view_range is None:
            return f"Here's the result of running `cat -n` on {path}:\n{_numbered(text)}"
        lines = text.split("\n")
        if (not isinstance(view_range, list) or len(view_range) != 2
                or not all(isinstance(n, int) for n in view_range)):
            raise ToolError("view_range must be [start, end] (end -1: to the end of the file)")
        start, end = view_range
        end = len(lines) if end == -1 else end
        if not 1 <= start <= end <= len(lines):
            raise ToolError(f"invalid view_range {view_range}: the file has {len(lines)} lines")
        return f"Lines {start}-{end} of {path}:\n" \
               f"{_numbered(chr(10).join(lines[start - 1:end]), start)}"

    async def _create(self, call: ToolCall, path: str) -> str:
        text = _arg(call, "file_text", str)
        exists = await self.sandbox.exec(["test", "-e", path],
                                         timeout_s=HARNESS_TIMEOUT_S)
        if exists.ok:
            raise ToolError(f"file already exists at {path}; `create` cannot overwrite it")
        await self._write(path, text, None)
        return f"File created successfully at: {path}"

    async def _replace(self, call: ToolCall, path: str) -> str:
        old = _arg(call, "old_str", str)
        new = _arg(call, "new_str", str, required=False) or ""
        text = await self._read(path)
        count = text.count(old) if old else 0
        if count == 0:
            raise ToolError(f"no replacement was performed: old_str did not appear verbatim "
                            f"in {path}")
        if count > 1:
            lines = sorted({text[:i].count("\n") + 1 for i in _find_all(text, old)})
            raise ToolError(f"no replacement was performed: old_str occurs {count} times in "
                            f"{path} (lines {lines}); make it unique")
        updated = text.replace(old, new, 1)
        await self._write(path, updated, text)
        line = text[:text.index(old)].count("\n")
        return self._snippet(path, updated, line, new.count("\n"))

    async def _insert(self, call: ToolCall, path: str) -> str:
        after = _arg(call, "insert_line", int)
        new = _arg(call, "new_str", str)
        text = await self._read(path)
        lines = text.split("\n")
        if not 0 <= after <= len(lines):
            raise ToolError(f"insert_line {after} is out of range: the file has "
                            f"{len(lines)} lines")
        updated = "\n".join([*lines[:after], *new.split("\n"), *lines[after:]])
        await self._write(path, updated, text)
        return self._snippet(path, updated, after, new.count("\n"))

    async def _undo(self, call: ToolCall, path: str) -> str:
        stack = self.undo.get(path)
        if not stack:
            raise ToolError(f"no edit to undo for {path}")
        previous = stack.pop()
        if not stack:
            del self.undo[path]
        await self._write(path, previous, None)
        return f"Last edit to {path} undone. Its content now:\n{_numbered(previous)}"

    @staticmethod
    def _snippet(path: str, text: str, line: int, added: int) -> str:
        lines = text.split("\n")
        start = max(0, line - SNIPPET_LINES)
        end = min(len(lines), line + added + SNIPPET_LINES + 1)
        return (f"The file {path} has been edited. A snippet of it:\n"
                f"{_numbered(chr(10).join(lines[start:end]), start + 1)}\n"
                "Review the change; edit again if needed.")


def _find_all(text: str, needle: str) -> list[int]:
    found, i = [], text.find(needle)
    while i != -1:
        found.append(i)
        i = text.find(needle, i + 1)
    return found
