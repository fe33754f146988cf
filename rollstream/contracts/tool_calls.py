"""Tool calls in a model's completion text, in the two forms models are trained on:

- Hermes / Qwen: `<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>`,
  possibly several, and possibly cut off before the closing tag (a stop at max_tokens);
- OpenAI: a JSON object `{"tool_calls": [{"type": "function", "function": {"name": ...,
  "arguments": "<JSON string>"}}]}`, or one bare `{"name": ..., "arguments": ...}` object.

Parsing never raises: a call that cannot be read becomes a `MalformedCall` whose message tells
the model what was wrong, so it gets an error observation instead of ending the episode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class MalformedCall:
    error: str  # shown to the model
    text: str  # what was written, for the record

    def as_json(self) -> dict[str, Any]:
        return {"error": self.error, "text": self.text}


Parsed = ToolCall | MalformedCall


def _call(obj: Any, text: str) -> Parsed:
    """A {"name", "arguments"} object (arguments as an object or a JSON string)."""
    if isinstance(obj, dict) and "function" in obj and isinstance(obj["function"], dict):
        obj = obj["function"]  # an OpenAI tool_calls entry
    if not isinstance(obj, dict):
        return MalformedCall("a tool call must be a JSON object with \"name\" and "
                             "\"arguments\"", text)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall("the tool call has no \"name\"", text)
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            return MalformedCall(f"the arguments of {name!r} are not valid JSON: {exc.msg} "
                                 f"(line {exc.lineno} column {exc.colno})", text)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return MalformedCall(f"the arguments of {name!r} must be a JSON object", text)
    return ToolCall(name, arguments)


def _loads(text: str) -> tuple[Any, str | None]:
    body = _FENCE.sub("", text.strip())
    try:
        return json.loads(body), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON in <tool_call>: {exc.msg} (line {exc.lineno} column " \
                     f"{exc.colno})"


def _json_objects(text: str) -> list[Any]:
    """Every top-level JSON object embedded in free text, left to right."""
    decoder = json.JSONDecoder()
    found, i = [], text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        found.append(obj)
        i = text.find("{", end)
    return found


def parse_tool_calls(text: str) -> list[Parsed]:
    """The tool calls in `text`, in order; [] when it holds none at all."""
    tagged = _HERMES.findall(text)
    if tagged:
        calls: list[Parsed] = []
        for body in tagged:
            obj, error = _loads(body)
            calls.append(MalformedCall(error, body) if error else _call(obj, body))
        return calls
    for obj in _json_objects(text):
        if isinstance(obj, dict) and isinstance(obj.get("tool_calls"), list):
            return [_call(entry, json.dumps(entry)) for entry in obj["tool_calls"]]
        if isinstance(obj, dict) and "name" in obj and ("arguments" in obj
                                                        or "parameters" in obj):
            return [_call(obj, json.dumps(obj))]
    return []


def hermes(call: ToolCall) -> str:
    """`call` written the Hermes way (what the scripted policy and the prompt's example use)."""
    return f"<tool_call>\n{json.dumps(call.as_json())}\n</tool_call>"
