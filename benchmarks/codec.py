"""Encode+decode cost of one Trajectory: Rollstream's packed token fields vs the obvious
alternatives, to justify the representation documented in schemas/turn.avsc.

Designs (same trajectory content, same text fields, timed in the same run, interleaved):
- ``rollstream``: the real codec. Token ids / logprobs arrive as Python lists (as parsed from an
  inference server's JSON reply), are packed with ``pack_ids`` / ``pack_logprobs`` (int32 / float32
  little-endian bytes) and Avro single-object encoded; decoding returns them as numpy arrays via
  ``unpack_ids`` / ``unpack_logprobs`` (what a trainer wants). Both conversions are timed.
- ``rollstream_ndarray``: the same codec when the caller already holds numpy arrays (no list
  conversion on the way in); for information only.
- ``json``: ``json.dumps(...).encode()`` / ``json.loads`` with lists of ints/floats in and out.
- ``avro_arrays``: Avro single-object encoding with a Turn schema whose token fields are
  ``array<int>`` / ``array<float>`` (built here from turn.avsc); lists in and out.

The baselines are timed without any numpy conversion, which favours them.
"""

from __future__ import annotations

import copy
import gc
import io
import json
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer

import schemas
from benchmarks import percentiles_ms, print_table, write_result
from rollstream.contracts.codec import (
    HEADER_LEN,
    MAGIC,
    codec,
    pack_ids,
    pack_logprobs,
    spec_fingerprint,
    unpack_ids,
    unpack_logprobs,
)

NAME = "codec"
SIZES = (1_000, 8_000, 32_000)
TURNS = 4
VOCAB = 150_000
TARGET_TOKENS = 32_000
TARGET_MS = 1.0
DESIGNS = ("rollstream", "rollstream_ndarray", "json", "avro_arrays")
BASELINES = ("json", "avro_arrays")
TOKEN_FIELDS = ("prompt_ids", "completion_ids", "logprobs")

# Words to build text fields from: text costs the same in every design, but a realistic amount of
# it keeps the ratios honest (the token fields are not the whole event).
_WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "with", "as", "was", "on", "be",
    "by", "this", "are", "or", "from", "at", "an", "which", "def", "return", "import", "self",
    "value", "result", "error", "file", "test", "assert", "None", "True", "False", "print",
    "open", "path", "list", "dict", "int", "str", "len", "range", "function", "class", "module",
    "answer", "step", "first", "then", "check", "output",
)


def _text(rng: random.Random, n_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(_WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def make_trajectory(total_tokens: int, seed: int = 0) -> dict[str, Any]:
    """A finished 4-turn episode holding ``total_tokens`` prompt+completion token ids.

    Split like an agent episode: the first prompt is 25% of the tokens, each later observation
    delta 5%, each completion 15%. Text is ~4 characters per token. Token fields are lists.
    """
    rng = random.Random(seed)
    first_prompt = total_tokens * 25 // 100
    obs = total_tokens * 5 // 100
    completion = (total_tokens - first_prompt - obs * (TURNS - 1)) // TURNS
    first_prompt = total_tokens - obs * (TURNS - 1) - completion * TURNS  # exact total
    turns = []
    for i in range(TURNS):
        n_prompt = first_prompt if i == 0 else obs
        turns.append({
            "index": i,
            "prompt_ids": [rng.randrange(VOCAB) for _ in range(n_prompt)],
            "completion_ids": [rng.randrange(VOCAB) for _ in range(completion)],
            # Sampled-token logprobs as a server reports them: Python floats (float64) <= 0.
            "logprobs": [-rng.expovariate(2.0) for _ in range(completion)],
            "policy_version": 7,
            "finish_reason": "stop",
            "completion_text": _text(rng, completion * 4),
            "tool_call": json.dumps({"name": "run_tests", "arguments": {"path": "tests/"}}),
            "observation": _text(rng, obs * 4),
            "server": "http://inference-3:8000",
            "started_at_ms": 1_760_000_000_000 + i * 2000,
            "inference_ms": 812.5 + i,
            "env_ms": 41.25,
        })
    return {
        "episode_id": f"task-00042/s3/{seed:08x}",
        "task": {
            "task_id": "task-00042",
            "env": "swe",
            "prompt": _text(rng, 600),
            "data": json.dumps({"repo": "example/repo", "tests": ["tests/test_a.py"]}),
            "group_size": 8,
            "max_turns": TURNS,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 2048,
                         "seed": None},
            "metadata": {"split": "train", "source": "benchmark"},
            "created_at_ms": 1_760_000_000_000,
        },
        "sample_index": 3,
        "turns": turns,
        "termination": "DONE",
        "termination_detail": "",
        "env_state": json.dumps({"cwd": "/repo", "step": TURNS}),
        "started_at_ms": 1_760_000_000_000,
        "finished_at_ms": 1_760_000_009_000,
    }


def count_tokens(traj: dict[str, Any]) -> int:
    return sum(len(t["prompt_ids"]) + len(t["completion_ids"]) for t in traj["turns"])


# -- designs: each is (encode(traj) -> bytes, decode(bytes) -> traj) -------------------------

Encoder = Callable[[dict[str, Any]], bytes]
Decoder = Callable[[bytes], dict[str, Any]]


def _rollstream() -> tuple[Encoder, Decoder]:
    c = codec()

    def encode(traj: dict[str, Any]) -> bytes:
        # Shallow copies: the caller's lists stay untouched, as a real producer's would.
        turns = [{**t, "prompt_ids": pack_ids(t["prompt_ids"]),
                  "completion_ids": pack_ids(t["completion_ids"]),
                  "logprobs": pack_logprobs(t["logprobs"])} for t in traj["turns"]]
        return c.encode("Trajectory", {**traj, "turns": turns})

    def decode(data: bytes) -> dict[str, Any]:
        traj = c.decode_as("Trajectory", data)
        for t in traj["turns"]:
            t["prompt_ids"] = unpack_ids(t["prompt_ids"])
            t["completion_ids"] = unpack_ids(t["completion_ids"])
            t["logprobs"] = unpack_logprobs(t["logprobs"])
        return traj

    return encode, decode


def _json() -> tuple[Encoder, Decoder]:
    def encode(traj: dict[str, Any]) -> bytes:
        return json.dumps(traj).encode()

    def decode(data: bytes) -> dict[str, Any]:
        return json.loads(data)

    return encode, decode


def array_turn_schemas() -> dict[str, Any]:
    """The current schemas, parsed, with Turn's bytes token fields replaced by Avro arrays."""
    raw = copy.deepcopy(schemas.raw_schemas())
    item = {"prompt_ids": "int", "completion_ids": "int", "logprobs": "float"}
    for f in raw["Turn"]["fields"]:
        if f["name"] in item:
            f["type"] = {"type": "array", "items": item[f["name"]]}
    return {name: parse_schema(s) for name, s in schemas.self_contained(raw).items()}


def _avro_arrays() -> tuple[Encoder, Decoder]:
    schema = array_turn_schemas()["Trajectory"]
    header = MAGIC + spec_fingerprint(schema)  # single-object encoding too, like the real codec

    def encode(traj: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        out.write(header)
        schemaless_writer(out, schema, traj)
        return out.getvalue()

    def decode(data: bytes) -> dict[str, Any]:
        if data[:HEADER_LEN] != header:
            raise ValueError("unexpected header")
        return schemaless_reader(io.BytesIO(data[HEADER_LEN:]), schema, schema)  # type: ignore[return-value]

    return encode, decode


def _as_ndarrays(traj: dict[str, Any]) -> dict[str, Any]:
    turns = [{**t, "prompt_ids": np.asarray(t["prompt_ids"], dtype=np.int32),
              "completion_ids": np.asarray(t["completion_ids"], dtype=np.int32),
              "logprobs": np.asarray(t["logprobs"], dtype=np.float32)} for t in traj["turns"]]
    return {**traj, "turns": turns}


def _check_roundtrip(design: str, original: dict[str, Any], decoded: dict[str, Any]) -> None:
    """Every design must give back the same content (float32 for packed/Avro-float logprobs)."""
    for a, b in zip(original["turns"], decoded["turns"], strict=True):
        for f in TOKEN_FIELDS:
            want = np.asarray(a[f], dtype=np.float32 if f == "logprobs" else np.int64)
            got = np.asarray(b[f], dtype=want.dtype)
            tol = 0 if f != "logprobs" else 1e-6
            if want.shape != got.shape or not np.allclose(want, got, rtol=tol, atol=0):
                raise AssertionError(f"{design}: {f} differs after a round trip")
        if a["completion_text"] != b["completion_text"]:
            raise AssertionError(f"{design}: completion_text differs after a round trip")
    if original["task"] != decoded["task"]:
        raise AssertionError(f"{design}: task differs after a round trip")


def _measure_size(tokens: int, quick: bool) -> dict[str, Any]:
    traj = make_trajectory(tokens, seed=tokens)
    inputs = {d: traj for d in DESIGNS}
    inputs["rollstream_ndarray"] = _as_ndarrays(traj)
    rs = _rollstream()
    impl: dict[str, tuple[Encoder, Decoder]] = {
        "rollstream": rs, "rollstream_ndarray": rs, "json": _json(), "avro_arrays": _avro_arrays(),
    }
    sizes: dict[str, int] = {}
    for d, (enc, dec) in impl.items():
        data = enc(inputs[d])
        sizes[d] = len(data)
        _check_roundtrip(d, traj, dec(data))

    # Iterations: enough for a stable p99, bounded in time (the 32k JSON round trip is slow).
    max_iters = {1_000: 3000, 8_000: 1000, 32_000: 500}[tokens] // (5 if quick else 1)
    budget_s = 2.0 if quick else 12.0
    warmup = 10 if quick else 30
    enc_ns: dict[str, list[int]] = {d: [] for d in DESIGNS}
    dec_ns: dict[str, list[int]] = {d: [] for d in DESIGNS}
    gc.collect()
    deadline = time.monotonic() + budget_s
    it = 0
    # Designs interleaved round by round: drift from other load on the machine hits all alike.
    while it < warmup + max_iters and (it < warmup + 100 or time.monotonic() < deadline):
        for d in DESIGNS:
            enc, dec = impl[d]
            value = inputs[d]
            t0 = time.perf_counter_ns()
            data = enc(value)
            t1 = time.perf_counter_ns()
            dec(data)
            t2 = time.perf_counter_ns()
            if it >= warmup:
                enc_ns[d].append(t1 - t0)
                dec_ns[d].append(t2 - t1)
        it += 1

    out: dict[str, Any] = {"tokens": count_tokens(traj), "iterations": it - warmup, "designs": {}}
    for d in DESIGNS:
        e, k = np.asarray(enc_ns[d]), np.asarray(dec_ns[d])
        out["designs"][d] = {
            "bytes_per_event": sizes[d],
            "bytes_per_token": round(sizes[d] / out["tokens"], 2),
            "encode": percentiles_ms(e),
            "decode": percentiles_ms(k),
            "encode_decode": percentiles_ms(e + k),
        }
    d = out["designs"]
    out["ratios"] = {
        f"{b}_over_{r}": {
            "encode_decode_median": round(
                d[b]["encode_decode"]["median_ms"] / d[r]["encode_decode"]["median_ms"], 2),
            "encode_decode_p99": round(
                d[b]["encode_decode"]["p99_ms"] / d[r]["encode_decode"]["p99_ms"], 2),
            "bytes": round(sizes[b] / sizes[r], 2),
        }
        for b in BASELINES
        for r in ("rollstream", "rollstream_ndarray")
    }
    return out


def run(quick: bool = False) -> dict[str, Any]:
    results = {str(n): _measure_size(n, quick) for n in SIZES}
    target = results[str(TARGET_TOKENS)]["designs"]["rollstream"]["encode_decode"]
    met = target["median_ms"] <= TARGET_MS
    doc = {
        "quick": quick,
        "parameters": {
            "sizes_total_tokens": list(SIZES),
            "turns": TURNS,
            "token_split": "first prompt 25%, 3 observation deltas 5% each, 4 completions 15% each",
            "text": "completion_text and observation ~4 characters per token, task prompt 600",
            "token_ids": f"uniform random ints < {VOCAB}",
            "logprobs": "random floats <= 0 (Python float64 in lists)",
            "timer": "time.perf_counter_ns around encode and decode separately, after warm-up; "
                     "designs interleaved per iteration; gc enabled",
            "conversions": {
                "rollstream": "encode from Python lists (pack_ids/pack_logprobs), decode to "
                              "numpy ndarrays (unpack_ids/unpack_logprobs); both timed",
                "rollstream_ndarray": "encode from numpy int32/float32 arrays, decode to "
                                      "ndarrays (informational)",
                "json": "Python lists in, Python lists out (no numpy conversion)",
                "avro_arrays": "Python lists in, Python lists out (no numpy conversion)",
            },
        },
        "results": results,
        "baseline": {
            b: results[str(TARGET_TOKENS)]["designs"][b]["encode_decode"] for b in BASELINES
        },
        "ratio": {
            b: results[str(TARGET_TOKENS)]["ratios"][f"{b}_over_rollstream"]["encode_decode_median"]
            for b in BASELINES
        },
        "ratio_meaning": "baseline median encode+decode time / rollstream's, at 32k tokens "
                         "(higher: rollstream faster); results.<size>.ratios also has them "
                         "against rollstream_ndarray",
        "target": {
            "description": f"rollstream encode+decode of a {TARGET_TOKENS}-token Trajectory, "
                           f"median <= {TARGET_MS} ms",
            "measured_median_ms": target["median_ms"],
            "met": met,
        },
    }
    path = write_result(NAME, doc)
    _print(results, doc, path.name)
    return doc


def _print(results: dict[str, Any], doc: dict[str, Any], filename: str) -> None:
    rows = []
    for size, r in results.items():
        for d in DESIGNS:
            s = r["designs"][d]
            ratio = r["ratios"].get(f"{d}_over_rollstream", {}).get("encode_decode_median")
            rows.append([
                size, d, s["encode"]["median_ms"], s["decode"]["median_ms"],
                s["encode_decode"]["median_ms"], s["encode_decode"]["p99_ms"],
                s["bytes_per_event"], "" if ratio is None else f"{ratio:.1f}x",
            ])
    print_table(f"codec: Trajectory encode+decode (ms; ratio = baseline / rollstream) "
                f"-> results/{filename}",
                ["tokens", "design", "enc med", "dec med", "e+d med", "e+d p99", "bytes",
                 "ratio"], rows)
    t = doc["target"]
    print(f"  target: {t['description']}: {t['measured_median_ms']:.3f} ms -> "
          f"{'MET' if t['met'] else 'NOT MET'}")


if __name__ == "__main__":
    run(quick="--quick" in sys.argv[1:])
