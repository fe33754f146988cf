"""RUN's turn checkpoints: the bytes a turn's checkpoint writes against the bytes the turn adds to
the trajectory, per-turn records against the whole trajectory so far, and which compression
codec the producer and the topics share.

A SWE-style episode of `TURNS` turns whose context grows to about 32k tokens: a first prompt of
`FIRST_PROMPT` tokens, then each turn a completion of `COMPLETION` tokens and an observation of
`OBSERVATION` tokens (the next turn's prompt delta). Token ids are Zipf-distributed over a
150,000-token vocabulary (natural text's ranks, not uniform noise, which would flatter no codec),
logprobs those of a confident sampler (mostly near 0), and the text is this repository's own
source and docs (what a coding agent reads and writes), about 4 characters a token.

1. **Bytes per turn.** Each turn's checkpoint, encoded with the real codec (a TurnCheckpoint, its
   key, and the tombstone its key gets when the episode ends), each record counted as Kafka
   stores it uncompressed: its framing in a v2 batch (`RECORD_FRAMING`), key, value and headers
   (the codec's record and fingerprint headers; a tombstone has none); against what the turn
   adds to the Trajectory on <p>.trajectories, and against the earlier layout's checkpoint (the
   whole trajectory so far, framed the same way).
2. **Codec.** lz4 and zstd, at librdkafka's default levels (lz4 frame at its fast level, zstd
   level 3), over batches as the producer makes them: the checkpoints of `BATCH` different
   episodes' turns, and trajectories. Compressed bytes and the CPU to compress and decompress,
   interleaved rep by rep, median of `REPS`. The producer and every topic then use the winner, so
   brokers store batches as written instead of recompressing them.
3. **Restore** (the only part that needs a broker: the bundled one, started if it is not
   running). `RESTORE_EPISODES` episodes cut off after `RESTORE_TURNS` turns, as a SIGKILLed RUN
   leaves them, checkpointed both ways on a fresh one-partition <p>.episode-state each: a
   TurnCheckpoint per turn, and the earlier release's whole trajectory after every turn (which
   RUN still reads). The time for RunStage to read each back and rebuild the episodes, and the
   bytes it read, before compaction (within the topic's hour-long segments, the usual case).

Target: the checkpoint of turn 50 writes at most 1.5x the bytes that turn adds to the trajectory.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import cramjam
import numpy as np

from benchmarks import print_table, write_result
from rollstream.broker import local
from rollstream.cluster import kafka
from rollstream.cluster.topics import create_topics, delete_topics
from rollstream.config import load
from rollstream.contracts.codec import codec, pack_ids, pack_logprobs
from stages.run import RunStage

NAME = "checkpoint"
TURNS = 50
FIRST_PROMPT = 2000
COMPLETION = 300
OBSERVATION = 300
VOCAB = 150_000
CHARS_PER_TOKEN = 4
BATCH = 16  # records per producer batch (a linger window's turns of different episodes)
REPS = 30
# A v2 record's varints (length, attributes, timestamp and offset deltas, key and value lengths,
# header count): about 12 bytes; each header adds its name and value and two length varints.
RECORD_FRAMING = 12
TARGET_RATIO = 1.5
REPO = Path(__file__).resolve().parents[1]
RESTORE_EPISODES = 100
RESTORE_TURNS = 20


class Corpus:
    """Text of this repository, taken in consecutive slices."""

    def __init__(self) -> None:
        files = sorted([*REPO.glob("rollstream/**/*.py"), *REPO.glob("docs/*.md")])
        self.text = "\n".join(p.read_text() for p in files)
        self.at = 0

    def take(self, chars: int) -> str:
        if self.at + chars > len(self.text):
            self.at = 0
        out = self.text[self.at:self.at + chars]
        self.at += chars
        return out


def episode(rng: np.random.Generator, corpus: Corpus, episode_id: str) -> dict:
    """A finished Trajectory of TURNS turns, its ids and logprobs as packed arrays."""
    ranks = rng.permutation(VOCAB)  # which token id each Zipf rank is

    def ids(n: int) -> bytes:
        return pack_ids(ranks[np.minimum(rng.zipf(1.2, n), VOCAB) - 1])

    turns = []
    for i in range(TURNS):
        turns.append({
            "index": i, "prompt_ids": ids(FIRST_PROMPT if i == 0 else OBSERVATION),
            "completion_ids": ids(COMPLETION),
            "logprobs": pack_logprobs(-rng.exponential(0.3, COMPLETION)),
            "policy_version": 12, "adapter": None, "finish_reason": "stop",
            "completion_text": corpus.take(COMPLETION * CHARS_PER_TOKEN),
            "tool_call": json.dumps({"name": "bash", "arguments": {"command": "pytest -q"}}),
            "observation": corpus.take(OBSERVATION * CHARS_PER_TOKEN),
            "server": "http://rollout-7.inference:8000", "started_at_ms": 1_700_000_000_000 + i,
            "inference_ms": 812.5, "env_ms": 95.25, "new_sample": False,
        })
    task = {"task_id": episode_id.split("#")[0], "env": "swe", "prompt": corpus.take(2000),
            "data": "{}", "group_size": 8, "max_turns": TURNS,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 4096,
                         "seed": None},
            "metadata": {}, "created_at_ms": 1}
    return {"episode_id": episode_id, "task": task, "sample_index": 0, "turns": turns,
            "termination": "DONE", "termination_detail": "", "env_state": '{"workspace": "w-1"}',
            "started_at_ms": 1_700_000_000_000, "finished_at_ms": 1_700_000_100_000}


def turn_checkpoint(trajectory: dict, index: int) -> bytes:
    return codec().encode("TurnCheckpoint", {
        "episode_id": trajectory["episode_id"], "turn": trajectory["turns"][index],
        "env_state": trajectory["env_state"], "previous_observation": None,
        "started_at_ms": trajectory["started_at_ms"]})


def record_bytes(key: str, value: bytes | None) -> int:
    """The bytes one record takes in a Kafka batch before compression."""
    headers = codec().headers_for(value) or []
    return (RECORD_FRAMING + len(key) + len(value or b"")
            + sum(len(k) + len(v) + 2 for k, v in headers))


def bytes_per_turn(trajectory: dict) -> list[dict]:
    """Per turn: what its checkpoint writes now, what the earlier whole-trajectory checkpoint
    wrote, and what the turn adds to the trajectory, in bytes with record overhead."""
    c = codec()
    episode_id = trajectory["episode_id"]
    encoded = [c.encode("Trajectory", {**trajectory, "turns": trajectory["turns"][:n]})
               for n in range(TURNS + 1)]
    so_far = [len(e) for e in encoded]
    rows = []
    for i in range(TURNS):
        key = f"{episode_id}/{i}"
        # The record, and the tombstone its key gets at the episode's end.
        now = record_bytes(key, turn_checkpoint(trajectory, i)) + record_bytes(key, None)
        before = record_bytes(episode_id, encoded[i + 1])
        rows.append({"turn": i + 1, "checkpoint_bytes": now, "whole_trajectory_bytes": before,
                     "turn_adds_bytes": so_far[i + 1] - so_far[i]})
    return rows


def codecs(batches: dict[str, list[bytes]], reps: int) -> dict[str, dict]:
    """lz4 vs zstd on each kind of batch: compressed/raw and CPU µs per raw MiB."""
    coders = {
        "lz4": (lambda b: bytes(cramjam.lz4.compress(b, level=0)),
                lambda b: bytes(cramjam.lz4.decompress(b))),
        "zstd": (lambda b: bytes(cramjam.zstd.compress(b, level=3)),
                 lambda b: bytes(cramjam.zstd.decompress(b))),
    }
    out: dict[str, dict] = {}
    for kind, raw in batches.items():
        size = sum(len(b) for b in raw)
        times: dict[str, dict[str, list[float]]] = {n: {"compress": [], "decompress": []}
                                                    for n in coders}
        packed: dict[str, int] = {}
        for _ in range(reps):
            for name, (compress, decompress) in coders.items():  # interleaved rep by rep
                start = time.process_time()
                done = [compress(b) for b in raw]
                mid = time.process_time()
                for b in done:
                    decompress(b)
                end = time.process_time()
                times[name]["compress"].append(mid - start)
                times[name]["decompress"].append(end - mid)
                packed[name] = sum(len(b) for b in done)
        out[kind] = {"raw_bytes": size, **{name: {
            "ratio": round(packed[name] / size, 4),
            "compress_ms_per_mib": round(1e3 * float(np.median(t["compress"])) * (1 << 20) / size,
                                         3),
            "decompress_ms_per_mib": round(
                1e3 * float(np.median(t["decompress"])) * (1 << 20) / size, 3),
        } for name, t in times.items()}}
    return out


def restore(episodes: list[dict], turns: int) -> dict[str, dict]:
    """Both checkpoint layouts of `episodes` cut off after `turns` turns, read back by RUN."""
    settings = load(bootstrap_servers=local.resolve_bootstrap(), partitions=1,
                    prefix=f"ckpt{uuid.uuid4().hex[:8]}")
    c = codec()
    layouts = {
        "per_turn": lambda t, i: (f"{t['episode_id']}/{i}", turn_checkpoint(t, i)),
        "whole_trajectory": lambda t, i: (t["episode_id"], c.encode("Trajectory", {
            **t, "turns": t["turns"][:i + 1], "termination": "RUNNING"})),
    }
    out: dict[str, dict] = {}
    for name, record in layouts.items():
        prefix = f"{settings.prefix}{name[0]}"
        own = replace(settings, prefix=prefix)
        create_topics(own.bootstrap_servers, prefix, partitions=1)
        try:
            producer = kafka.producer(own)
            written = 0
            for i in range(turns):  # turn by turn, the episodes interleaved as RUN writes them
                for t in episodes:
                    key, value = record(t, i)
                    written += len(value)
                    kafka.produce(producer, own.topics.episode_state, value, key=key, partition=0)
            producer.flush(120)
            stage = RunStage(own)
            cpu, started = time.process_time(), time.perf_counter()
            saved = stage._read_checkpoints([0])[0]
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            assert sorted(saved) == sorted(t["episode_id"] for t in episodes)
            assert all(len(s.played()[0]) == turns for s in saved.values())
            out[name] = {"records": turns * len(episodes), "value_bytes": written,
                         "seconds": round(elapsed, 3), "cpu_s": round(cpu, 3)}
        finally:
            delete_topics(own.bootstrap_servers, prefix)
    return out


def run(quick: bool = False) -> dict:
    reps = 3 if quick else REPS
    rng = np.random.default_rng(7)
    corpus = Corpus()
    episodes = [episode(rng, corpus, f"task-{e}#0") for e in range(BATCH)]
    rows = bytes_per_turn(episodes[0])
    last = rows[-1]
    ratio = last["checkpoint_bytes"] / last["turn_adds_bytes"]
    total_now = sum(r["checkpoint_bytes"] for r in rows)
    total_before = sum(r["whole_trajectory_bytes"] for r in rows)
    # Producer batches: turn i of BATCH episodes together; and finished trajectories.
    checkpoint_batches = [b"".join(turn_checkpoint(t, i) for t in episodes) for i in range(TURNS)]
    trajectory_batches = [codec().encode("Trajectory", t) for t in episodes[:4]]
    compression = codecs({"checkpoints": checkpoint_batches, "trajectories": trajectory_batches},
                         reps)
    cut = [episode(rng, corpus, f"cut-{e}#0") for e in range(20 if quick else RESTORE_EPISODES)]
    restored = restore(cut, 10 if quick else RESTORE_TURNS)
    restore_ratio = round(restored["whole_trajectory"]["seconds"]
                          / restored["per_turn"]["seconds"], 2)
    print_table("checkpoint bytes per turn (with record overhead and the tombstone)",
                ["turn", "per-turn checkpoint", "whole trajectory", "turn adds", "ratio"],
                [[r["turn"], r["checkpoint_bytes"], r["whole_trajectory_bytes"],
                  r["turn_adds_bytes"], r["checkpoint_bytes"] / r["turn_adds_bytes"]]
                 for r in rows if r["turn"] in (1, 2, 10, 25, 50)])
    print_table("compression (ratio = compressed/raw; CPU ms per raw MiB)",
                ["batches", "codec", "ratio", "compress", "decompress"],
                [[kind, name, v[name]["ratio"], v[name]["compress_ms_per_mib"],
                  v[name]["decompress_ms_per_mib"]]
                 for kind, v in compression.items() for name in ("lz4", "zstd")])
    print_table(f"restore of {len(cut)} episodes cut off after "
                f"{10 if quick else RESTORE_TURNS} turns, before compaction",
                ["layout", "records", "value bytes", "seconds", "CPU s"],
                [[n, r["records"], r["value_bytes"], r["seconds"], r["cpu_s"]]
                 for n, r in restored.items()])
    doc = {
        "workload": {"turns": TURNS, "first_prompt_tokens": FIRST_PROMPT,
                     "completion_tokens": COMPLETION, "observation_tokens": OBSERVATION,
                     "context_tokens_at_end": FIRST_PROMPT + TURNS * (COMPLETION + OBSERVATION),
                     "record_framing_bytes": RECORD_FRAMING, "batch_records": BATCH,
                     "reps": reps, "quick": quick},
        "per_turn": rows,
        "at_turn_50": {"checkpoint_bytes": last["checkpoint_bytes"],
                       "turn_adds_bytes": last["turn_adds_bytes"],
                       "whole_trajectory_bytes": last["whole_trajectory_bytes"],
                       "ratio": round(ratio, 3)},
        "episode_total": {"per_turn_checkpoints_bytes": total_now,
                          "whole_trajectory_checkpoints_bytes": total_before,
                          "reduction": round(total_before / total_now, 2)},
        "compression": compression,
        "restore": {"episodes": len(cut), "turns": 10 if quick else RESTORE_TURNS,
                    "before_compaction": True, **restored,
                    "whole_over_per_turn_seconds": restore_ratio},
        "target": {"checkpoint_over_turn_at_50_max": TARGET_RATIO, "met": ratio <= TARGET_RATIO},
    }
    path = write_result(NAME, doc)
    print(f"\nturn 50: checkpoint {ratio:.2f}x what the turn adds (target <= {TARGET_RATIO}); "
          f"an episode's checkpoints {total_before / total_now:.1f}x fewer bytes than whole "
          f"trajectories; {path}")
    return doc


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
