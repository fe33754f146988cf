"""Trajectories as older writers encoded them (earlier Turn layouts, other fingerprints), for the
schema-evolution tests."""

from __future__ import annotations

import io

from fastavro import parse_schema, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from rollstream.contracts.codec import MAGIC, pack_ids, pack_logprobs


def old_trajectory() -> dict:
    turn = {"index": 0, "prompt_ids": pack_ids([258, 65, 260, 259]),
            "completion_ids": pack_ids([66, 260]), "logprobs": pack_logprobs([-0.1, -0.2]),
            "policy_version": 2, "finish_reason": "stop", "completion_text": "B",
            "tool_call": None, "observation": None, "server": "s", "started_at_ms": 1,
            "inference_ms": 1.0, "env_ms": 0.0}
    task = {"task_id": "t", "env": "arithmetic", "prompt": "A", "data": "{}", "group_size": 1,
            "max_turns": 1, "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                         "max_tokens": 8, "seed": None},
            "metadata": {}, "created_at_ms": 0}
    return {"episode_id": "t#0", "task": task, "sample_index": 0, "turns": [turn],
            "termination": "DONE", "termination_detail": "", "env_state": "{}",
            "started_at_ms": 1, "finished_at_ms": 2}


def encode_with(schema: dict, canonical_of: dict, value: dict) -> bytes:
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(schema), value)
    crc = fingerprint(to_parsing_canonical_form(parse_schema(canonical_of)), "CRC-64-AVRO")
    return MAGIC + bytes.fromhex(crc) + body.getvalue()
