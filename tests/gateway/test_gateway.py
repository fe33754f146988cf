"""RUN's recording gateway over real HTTP, against the scripted policy server (vLLM's contract):
every call is recorded as a Turn whose sample is token-for-token the chat template's rendering
of the call's messages, or a flagged new sample; streaming; budgets; infra failures.

The expected renderings are built here, independently of the gateway: the template's own
`render` of the messages, with each assistant tool call written back in the Hermes form the
policy sampled it in."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import rollstream.turns
from rollstream.contracts.codec import unpack_ids
from rollstream.contracts.inference import END, ByteTokenizer, EmbeddedChatTemplate
from rollstream.contracts.tool_calls import ToolCall, hermes
from rollstream.dev.background import BackgroundServer
from rollstream.dev.processes import free_port
from rollstream.dev.scripted import Script, create_app
from rollstream.gateway.server import EXEC_PATH, Gateway, GatewayEpisode
from rollstream.runtime import EventContext, Output
from stages.run import RunStage
from tests.helpers.run_helpers import run_settings

TASK_TEXT = "Fix the off-by-one in wrap()."
SCRIPT = [
    "THOUGHT: look first.\n" + hermes(ToolCall("bash", {"command": "ls"})),
    "THOUGHT: two things at once.\n" + hermes(ToolCall("bash", {"command": "cat a.py"}))
    + "\n" + hermes(ToolCall("bash", {"command": "cat b.py"})),
    "All done, nothing more to run.",
]


@pytest.fixture
def policy_url() -> Iterator[str]:
    with BackgroundServer(app=create_app([Script(TASK_TEXT, SCRIPT)])) as url:
        yield url


class Harness:
    """One gateway episode, driven over HTTP the way a harness drives it."""

    def __init__(self, gateway: Gateway, episode: GatewayEpisode,
                 emitted: list[Output]) -> None:
        self.gateway, self.episode, self.emitted = gateway, episode, emitted

    async def post(self, body: dict[str, Any], key: str | None = None,
                   path: str = "/v1/chat/completions") -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key or self.episode.key}"}
        async with aiohttp.ClientSession() as http, http.post(
                self.gateway.base_url + path, json=body, headers=headers) as r:
            if r.content_type == "text/event-stream":
                return r.status, await r.text()
            return r.status, await r.json()

    async def chat(self, messages: list[dict], **extra: Any) -> dict:
        status, body = await self.post({"model": "any", "messages": messages, **extra})
        assert status == 200, body
        return body


async def with_harness(url: str, test: Any, max_turns: int = 8,
                       max_total_tokens: int | None = None) -> None:
    stage = RunStage(run_settings([url]))
    await stage.start()
    gateway = stage.gateway
    await gateway.start()
    task = {"task_id": "t", "env": "harness", "prompt": "", "data": "{}",
            "max_turns": max_turns, "group_size": 1,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 512,
                         "seed": None}}
    trajectory = {"episode_id": "t#0", "task": task, "sample_index": 0, "turns": [],
                  "termination": "RUNNING", "termination_detail": "", "env_state": "{}",
                  "started_at_ms": 1}
    emitted: list[Output] = []
    stage.router.pin("t#0")
    # The runtime encodes an output when it is emitted: keep a copy as it was then.
    ctx = EventContext(0, 0, lambda out: emitted.append(copy.deepcopy(out)))
    episode = gateway.open(trajectory, ctx, None, {}, max_total_tokens)  # type: ignore[arg-type]
    try:
        await test(Harness(gateway, episode, emitted))
    finally:
        await stage.close()


def expected_rendering(messages: list[dict]) -> list[int]:
    """The embedded template's rendering, tool calls written the Hermes way."""
    flat = []
    for m in messages:
        text = m.get("content") or ""
        if m["role"] == "assistant":
            for call in m.get("tool_calls") or []:
                fn = call["function"]
                text += ("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": json.loads(
                    fn["arguments"])}) + "\n</tool_call>\n")
            text = text.removesuffix("\n") if m.get("tool_calls") else text
        flat.append({"role": m["role"], "content": text})
    return EmbeddedChatTemplate().render(flat, add_generation_prompt=True)


def echoed(message: dict) -> dict:
    """The assistant message as a client sends it back (litellm adds provider fields)."""
    return {**message, "function_call": None, "provider_specific_fields": {}}


def tool_results(message: dict, outputs: list[str]) -> list[dict]:
    return [{"role": "tool", "tool_call_id": call["id"], "content": out}
            for call, out in zip(message["tool_calls"], outputs, strict=True)]


def test_every_sample_is_the_templates_rendering_or_a_flagged_new_sample(
        policy_url: str) -> None:
    calls: list[list[dict]] = []

    async def drive(h: Harness) -> None:
        messages = [{"role": "system", "content": "You are a shell agent."},
                    {"role": "user", "content": TASK_TEXT}]
        for outputs in (["a.py b.py"], ["x = 1", "y = 2"], None):
            calls.append(list(messages))
            answer = (await h.chat(messages))["choices"][0]
            if outputs is None:
                assert answer["finish_reason"] == "stop"
                assert answer["message"] == {"role": "assistant", "content": SCRIPT[2]}
                break
            assert answer["finish_reason"] == "tool_calls"
            messages += [echoed(answer["message"]), *tool_results(answer["message"], outputs)]
        # The harness compacts its history: what it sends no longer extends the sample.
        compacted = [messages[0], messages[1], {"role": "user", "content": "Summary: done."}]
        calls.append(compacted)
        await h.chat(compacted)

    trajectory: dict = {}

    async def run(h: Harness) -> None:
        await drive(h)
        trajectory.update(h.episode.trajectory)
        # A checkpoint after every call, holding that call's turn only, keyed by its index; the
        # harness's answer to a turn comes with the next call, so its checkpoint carries it.
        assert [o.key for o in h.emitted] == [f"t#0/{i}" for i in range(4)]
        assert [o.value["turn"]["index"] for o in h.emitted] == [0, 1, 2, 3]
        observations = [t["observation"] for t in h.episode.trajectory["turns"]]
        assert observations[:2] == ["a.py b.py", "x = 1\ny = 2"]
        assert [o.value["previous_observation"] for o in h.emitted] == [None, *observations[:3]]
        assert {o.topic for o in h.emitted} == {run_settings([]).topics.episode_state}

    asyncio.run(with_harness(policy_url, run))
    turns = trajectory["turns"]
    assert [t["new_sample"] for t in turns] == [False, False, False, True]
    # The compacted call has no assistant turn yet: the script starts over.
    sampled = [SCRIPT[0], SCRIPT[1], SCRIPT[2], SCRIPT[0]]
    sample: list[int] = []
    for turn, messages, text in zip(turns, calls, sampled, strict=True):
        if turn["new_sample"]:
            sample = []
        prompt = unpack_ids(turn["prompt_ids"]).tolist()
        completion = unpack_ids(turn["completion_ids"]).tolist()
        assert sample + prompt == expected_rendering(messages)  # token for token
        # What was sampled is recorded verbatim: the script's bytes and the stop token.
        assert completion == [*ByteTokenizer().encode(text), END]
        assert len(turn["logprobs"]) == 4 * len(completion)
        assert turn["policy_version"] == 0
        sample += prompt + completion
    assert json.loads(turns[1]["tool_call"]) == [
        {"name": "bash", "arguments": {"command": "cat a.py"}},
        {"name": "bash", "arguments": {"command": "cat b.py"}}]
    assert turns[2]["tool_call"] is None
    assert turns[0]["observation"] == "a.py b.py"  # the harness's answer to the turn


def sse_events(text: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_streaming_sends_the_same_answer_as_server_sent_events(policy_url: str) -> None:
    async def run(h: Harness) -> None:
        messages = [{"role": "user", "content": TASK_TEXT}]
        status, text = await h.post({"messages": messages, "stream": True,
                                     "stream_options": {"include_usage": True}})
        assert status == 200
        events = sse_events(text)
        assert all(e["object"] == "chat.completion.chunk" for e in events)
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert deltas[0]["role"] == "assistant"
        content = "".join(d.get("content") or "" for d in deltas)
        calls = [c for d in deltas for c in d.get("tool_calls", [])]
        assert content == "THOUGHT: look first.\n"
        assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in calls] == [(0, "bash", {"command": "ls"})]
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == (
            "tool_calls")
        usage = events[-1]["usage"]
        turn = h.episode.trajectory["turns"][0]
        assert usage["completion_tokens"] == len(unpack_ids(turn["completion_ids"]))
        assert usage["prompt_tokens"] == len(unpack_ids(turn["prompt_ids"]))

    asyncio.run(with_harness(policy_url, run))


def test_a_call_past_the_turn_budget_ends_the_episode(policy_url: str) -> None:
    async def run(h: Harness) -> None:
        messages = [{"role": "user", "content": TASK_TEXT}]
        await h.chat(messages)
        status, body = await h.post({"messages": messages})
        assert (status, body["error"]["code"]) == (400, "max_turns")
        assert h.episode.trajectory["termination"] == "MAX_TURNS"
        assert h.episode.ended.is_set()
        status, body = await h.post({"messages": messages})
        assert (status, body["error"]["code"]) == (409, "episode_ended")
        assert len(h.episode.trajectory["turns"]) == 1

    asyncio.run(with_harness(policy_url, run, max_turns=1))


def test_the_token_budget_truncates_the_episode(policy_url: str) -> None:
    async def run(h: Harness) -> None:
        messages = [{"role": "user", "content": TASK_TEXT}]
        await h.chat(messages)  # the first call fits
        status, body = await h.post({"messages": messages * 3})
        assert (status, body["error"]["code"]) == (400, "context_length_exceeded")
        assert h.episode.trajectory["termination"] == "TRUNCATED"
        assert "token budget of 200" in h.episode.trajectory["termination_detail"]

    asyncio.run(with_harness(policy_url, run, max_total_tokens=200))


def test_one_jobs_episode_key_is_refused_by_another_jobs_gateway(policy_url: str) -> None:
    """A fleet's RUN process makes each job a RunStage of its own (rollstream/service/fleet.py), so
    each job a gateway of its own: a harness holding one job's episode key is refused by the
    other job's gateway, for its calls to the model and to the sandbox alike."""
    async def alpha_then_beta(alpha: Harness) -> None:
        async def beta_refuses_alpha(beta: Harness) -> None:
            assert beta.gateway.base_url != alpha.gateway.base_url
            assert beta.episode.key != alpha.episode.key
            for path, body in (("/v1/chat/completions", {"messages": [
                    {"role": "user", "content": TASK_TEXT}]}),
                               (EXEC_PATH, {"command": "ls"})):
                status, answer = await beta.post(body, key=alpha.episode.key, path=path)
                assert (status, answer["error"]["code"]) == (401, "invalid_api_key"), path
            await beta.chat([{"role": "user", "content": TASK_TEXT}])  # its own key works
        await with_harness(policy_url, beta_refuses_alpha)
        assert alpha.episode.trajectory["turns"] == []  # nothing landed in alpha's episode

    asyncio.run(with_harness(policy_url, alpha_then_beta))


def test_bad_requests_are_refused_with_a_reason(policy_url: str) -> None:
    async def run(h: Harness) -> None:
        ok = {"messages": [{"role": "user", "content": TASK_TEXT}]}
        status, body = await h.post(ok, key="not-an-episode")
        assert (status, body["error"]["code"]) == (401, "invalid_api_key")
        status, body = await h.post({"messages": [{"role": "robot", "content": "hi"}]})
        assert status == 400 and "messages[0].role" in body["error"]["message"]
        status, body = await h.post({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]})
        assert status == 400 and "messages[0].content[0]" in body["error"]["message"]
        assert h.episode.trajectory["turns"] == []
        assert not h.episode.ended.is_set()

    asyncio.run(with_harness(policy_url, run))


def test_inference_down_past_the_retry_budget_is_infra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollstream.turns, "RETRY_DELAYS_S", (0.01, 0.01))
    monkeypatch.setattr(rollstream.turns, "OUTAGE_WINDOW_S", 0.5)  # no server ever comes up

    async def run(h: Harness) -> None:
        status, body = await h.post({"messages": [{"role": "user", "content": TASK_TEXT}]})
        assert (status, body["error"]["code"]) == (503, "inference_unavailable")
        assert h.episode.trajectory["termination"] == "INFRA_ERROR"
        assert h.episode.trajectory["turns"] == []

    asyncio.run(with_harness(f"http://127.0.0.1:{free_port()}", run))


# A Qwen2.5-style template with tools: their schemas in a system block, assistant tool calls
# as <tool_call> JSON, tool answers as <tool_response> in a user turn.
TOOL_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}"
    "{%- for t in tools %}{{- t | tojson }}{{- '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + m.content }}"
    "{%- for c in m.tool_calls or [] %}{{- '<tool_call>\\n{\"name\": \"' + c.function.name"
    " + '\", \"arguments\": ' }}{{- c.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + m.content }}"
    "{{- '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
BASH_TOOL = {"type": "function", "function": {
    "name": "bash", "description": "Run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def test_a_hugging_face_template_gets_tools_and_tool_calls(tmp_path: Path) -> None:
    from rollstream.gateway.messages import PromptBuilder, assistant_message, normalize
    from rollstream.inference.hf_template import HFChatTemplate
    from tests.helpers.tokenizer_helpers import tokenizer_dir

    template = HFChatTemplate(tokenizer_dir(tmp_path / "tok", TOOL_TEMPLATE))
    builder = PromptBuilder(template)
    messages = normalize([{"role": "user", "content": "Guess a number."}])
    prompt, new_sample = builder.prompt([], messages, [BASH_TOOL])
    text = template.decode(prompt)
    assert not new_sample
    assert text.startswith('<|im_start|>system\n# Tools\n{"type": "function"')
    assert text.endswith("<|im_start|>user\nGuess a number.<|im_end|>\n<|im_start|>assistant\n")
    # What the server samples: thought, one call the Hermes way, end of turn.
    sampled_text = 'Let me look.<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}' \
                   "\n</tool_call>"
    sample = prompt + template.encode(sampled_text) + [template.stop_token_ids[0]]
    message, recorded = assistant_message(sampled_text, 0)
    assert message["content"] == "Let me look."
    assert json.loads(recorded) == [{"name": "bash", "arguments": {"command": "ls"}}]
    follow = normalize([*messages, message, {"role": "tool", "tool_call_id": "call_0_0",
                                             "content": "a.py"}])
    delta, new_sample = builder.prompt(sample, follow, [BASH_TOOL])
    assert not new_sample  # the template writes the call back as it was sampled
    assert template.decode(sample + delta) == template.render(
        [*messages, {**message, "tool_calls": [{"function": {
            "name": "bash", "arguments": {"command": "ls"}}}]}, follow[-1]],
        add_generation_prompt=True, tools=[BASH_TOOL])
    # A harness that drops the call from its history: the whole rendering, a new sample.
    dropped = normalize([*messages, {"role": "user", "content": "Again."}])
    ids, new_sample = builder.prompt(sample, dropped, [BASH_TOOL])
    assert new_sample
    assert ids == template.encode(template.render(dropped, True, tools=[BASH_TOOL]))
