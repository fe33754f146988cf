"""OpenAI chat messages to the policy's token ids, and the policy's completion back to an OpenAI
assistant message.

Prompts follow RUN's rule (stages/run.py): the episode's current sample is kept as token ids,
sampled ids verbatim; a call whose messages the template renders as an extension of that sample
appends only the rest, and a call whose rendering does not start with it (the harness rewrote or
dropped history, or the template re-renders earlier turns) starts a new sample holding the whole
rendering (Turn.new_sample). Nothing is silently re-tokenized.

Tool calls in a completion are read with the parsers the environments use too
(rollstream.contracts.tool_calls: Hermes `<tool_call>` blocks or OpenAI JSON) and returned as
OpenAI `tool_calls`; the assistant message's `content` is the text before the first
`<tool_call>`, whitespace kept, so that content plus the calls written back the Hermes way is the
sampled text again. The embedded policy's template has
no tool syntax of its own, so an assistant message's tool calls are written back into its text
that way (what the policy sampled); a Hugging Face template gets them as structured
`tool_calls` and the request's `tools`, as transformers' `apply_chat_template` passes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rollstream.contracts.codec import Ids, id_list
from rollstream.contracts.inference import EmbeddedChatTemplate
from rollstream.contracts.tool_calls import ToolCall, hermes, parse_tool_calls

ROLES = ("system", "developer", "user", "assistant", "tool")


class BadChatRequest(ValueError):
    """The request does not follow the chat completions contract; the message says where."""


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                raise BadChatRequest(f"{where}.content[{i}]: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise BadChatRequest(f"{where}.content must be a string, null or a list of text parts")


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadChatRequest(f"{where}.tool_calls must be a list")
    calls = []
    for i, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise BadChatRequest(f"{where}.tool_calls[{i}] needs function.name")
        arguments = fn.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append({"id": str(call.get("id") or f"call_{i}"), "type": "function",
                      "function": {"name": fn["name"], "arguments": arguments}})
    return calls


def normalize(messages: Any) -> list[dict[str, Any]]:
    """The request's messages reduced to what a chat template reads (role, content, tool
    calls, tool call id, name); extra keys a client adds (provider fields) are dropped."""
    if not isinstance(messages, list) or not messages:
        raise BadChatRequest("'messages' must be a non-empty list")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping) or message.get("role") not in ROLES:
            raise BadChatRequest(f"{where}.role must be one of {', '.join(ROLES)}")
        item: dict[str, Any] = {"role": message["role"],
                                "content": _text(message.get("content"), where)}
        if message["role"] == "assistant":
            calls = _tool_calls(message.get("tool_calls"), where)
            if calls:
                item["tool_calls"] = calls
        if message["role"] == "tool":
            item["tool_call_id"] = str(message.get("tool_call_id") or "")
        if isinstance(message.get("name"), str):
            item["name"] = message["name"]
        out.append(item)
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return text


def _hermes_text(message: Mapping[str, Any]) -> str:
    """An assistant message as the embedded policy wrote it: content, then each tool call."""
    calls = [hermes(ToolCall(c["function"]["name"], _arguments(c["function"]["arguments"])))
             for c in message.get("tool_calls", [])]
    return message["content"] + "\n".join(calls)


class PromptBuilder:
    """RUN's chat template applied to OpenAI messages (see the module docstring)."""

    def __init__(self, template: Any) -> None:
        self.template = template
        self.embedded = isinstance(template, EmbeddedChatTemplate)

    def rendering(self, messages: Sequence[Mapping[str, Any]],
                  tools: Sequence[Mapping[str, Any]] | None) -> list[int] | str:
        """The template's whole rendering of the call, with the generation prompt: ids for the
        embedded template, text for a Hugging Face one."""
        if self.embedded:
            flat = [{"role": m["role"],
                     "content": _hermes_text(m) if m["role"] == "assistant" else m["content"]}
                    for m in messages]
            return self.template.render(flat, add_generation_prompt=True)
        structured = [{**m, "tool_calls": [
            {**c, "function": {**c["function"], "arguments": _arguments(
                c["function"]["arguments"])}} for c in m["tool_calls"]]}
            if m.get("tool_calls") else m for m in messages]
        return self.template.render(structured, add_generation_prompt=True, tools=tools or None)

    def prompt(self, sample: Ids, messages: Sequence[Mapping[str, Any]],
               tools: Sequence[Mapping[str, Any]] | None) -> tuple[list[int], bool]:
        """(ids to append to `sample`, False), or (the whole rendering's ids, True) when the
        rendering does not extend `sample`: a new sample."""
        rendered = self.rendering(messages, tools)
        if isinstance(rendered, list):
            if len(sample) and rendered[:len(sample)] == id_list(sample):
                return rendered[len(sample):], False
            return rendered, len(sample) > 0
        history = self.template.decode(sample) if len(sample) else ""
        if rendered.startswith(history):
            return self.template.encode(rendered[len(history):]), False
        return self.template.encode(rendered), True


def assistant_message(text: str, turn: int) -> tuple[dict[str, Any], str | None]:
    """The OpenAI assistant message for a completion, and the parsed calls as JSON for the
    Turn record (as the swe environment records them; None when there are none)."""
    parsed = parse_tool_calls(text)
    calls = [c for c in parsed if isinstance(c, ToolCall)]
    start = text.find("<tool_call>")
    content = text[:start] if start != -1 and calls else text
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{turn}_{i}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in enumerate(calls)]
    recorded = json.dumps([c.as_json() for c in parsed]) if parsed else None
    return message, recorded
