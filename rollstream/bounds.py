"""Bounds at the door: the limits every task (and every episode RUN is handed) must respect.

One check used where tasks enter (`rollstream publish`, before anything is sent) and by the
stages (INIT for tasks, RUN for episodes written straight to `episodes`), so a task that would
expand into a million episodes, sample with `top_p=inf` or make events larger than Kafka takes
is refused once, with the field named, instead of failing later episode by episode.

Limits come from Settings (defaults < config file < environment < flags); the size of an
episode is checked against the `episodes` topic's own `max.message.bytes`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rollstream.cluster.topics import TOPIC_SPECS
from rollstream.config import Bounds
from rollstream.contracts.codec import codec
from rollstream.contracts.events import EPISODE
from rollstream.runtime import InvalidEvent

INT32_MAX = 2**31 - 1
# Kafka's record batch header plus one record's framing, rounded up.
RECORD_OVERHEAD = 256


def topic_max_bytes(attr: str) -> int:
    """The `max.message.bytes` the topic graph sets on topic `attr` (a Topics property)."""
    (spec,) = [s for s in TOPIC_SPECS if s.attr == attr]
    return int(spec.config["max.message.bytes"])


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(field: str, value: Any) -> float:
    if not _number(value) or not math.isfinite(value):
        raise ValueError(f"field '{field}': must be a finite number, got {value!r}")
    return float(value)


def _int_in(field: str, value: Any, low: int, high: int, why: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        limit = f" ({why})" if why else ""
        raise ValueError(f"field '{field}': must be an integer in [{low}, {high}]{limit}, "
                         f"got {value!r}")


def check_sampling(sampling: dict[str, Any], bounds: Bounds) -> None:
    """Every sampling parameter finite and in the range the inference server accepts."""
    temperature = _finite("sampling.temperature", sampling["temperature"])
    if temperature < 0:
        raise ValueError(f"field 'sampling.temperature': must be >= 0, got {temperature!r}")
    top_p = _finite("sampling.top_p", sampling["top_p"])
    if not 0 < top_p <= 1:
        raise ValueError(f"field 'sampling.top_p': must be in (0, 1], got {top_p!r}")
    top_k = sampling["top_k"]
    # vLLM: -1 disables top-k; 0 is not a valid count.
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not (
            top_k == -1 or 1 <= top_k <= INT32_MAX):
        raise ValueError(f"field 'sampling.top_k': must be -1 (off) or a count >= 1, "
                         f"got {top_k!r}")
    _int_in("sampling.max_tokens", sampling["max_tokens"], 1, bounds.max_tokens_per_turn,
            "setting max_tokens_per_turn")
    seed = sampling.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)
                             or not -2**63 <= seed < 2**63):
        raise ValueError(f"field 'sampling.seed': must be null or a 64-bit integer, got {seed!r}")


def check_task(task: Mapping[str, Any], bounds: Bounds) -> None:
    """Raise ValueError("field '<path>': ...") if a complete Task dict breaks a bound."""
    task_id = task["task_id"]
    if not isinstance(task_id, str) or not task_id:
        raise ValueError("field 'task_id': must be a non-empty string")
    id_bytes = len(task_id.encode())
    if id_bytes > bounds.max_task_id_bytes:
        raise ValueError(f"field 'task_id': {id_bytes} bytes, over the limit of "
                         f"{bounds.max_task_id_bytes} (setting max_task_id_bytes)")
    _int_in("group_size", task["group_size"], 1, bounds.max_group_size,
            "setting max_group_size")
    _int_in("max_turns", task["max_turns"], 1, bounds.max_turns_per_episode,
            "setting max_turns_per_episode")
    check_sampling(task["sampling"], bounds)
    budget = task["max_turns"] * task["sampling"]["max_tokens"]
    if budget > bounds.max_episode_tokens:
        raise ValueError(
            f"field 'max_turns': max_turns x sampling.max_tokens = {budget} tokens, over the "
            f"episode budget of {bounds.max_episode_tokens} (setting max_episode_tokens)")
    prompt_bytes = len(task["prompt"].encode())
    if prompt_bytes > bounds.max_prompt_bytes:
        raise ValueError(f"field 'prompt': {prompt_bytes} bytes, over the limit of "
                         f"{bounds.max_prompt_bytes} (setting max_prompt_bytes)")
    _check_episode_size(task)


def _check_episode_size(task: Mapping[str, Any]) -> None:
    """The largest episode this task expands into must fit the `episodes` topic."""
    last = task["group_size"] - 1
    episode_id = f"{task['task_id']}#{last}"
    encoded = codec().encode(EPISODE, {"episode_id": episode_id, "task": task,
                                         "sample_index": last, "created_at_ms": 2**62})
    # The key (the episode id) and record overhead count against the limit too.
    size = len(encoded) + len(episode_id.encode()) + RECORD_OVERHEAD
    limit = topic_max_bytes("episodes")
    if size > limit:
        raise ValueError(f"task: each episode would be {size} bytes, over the episodes topic's "
                         f"max.message.bytes of {limit} (prompt, data and metadata too large)")


def check_episode(episode: Mapping[str, Any], bounds: Bounds) -> None:
    """RUN's input check: an episode written straight to `episodes` meets the task bounds, and
    its sample index lies inside its group; else InvalidEvent (it is dead-lettered)."""
    try:
        check_task(episode["task"], bounds)
        _int_in("sample_index", episode["sample_index"], 0, episode["task"]["group_size"] - 1,
                "inside the task's group")
    except ValueError as exc:
        raise InvalidEvent(f"episode {show_id(episode['episode_id'])}: {exc}") from None


def show_id(event_id: str) -> str:
    """An id for an error message: a hostile id can be megabytes long, so it is cut."""
    return repr(event_id) if len(event_id) <= 80 else (
        f"{event_id[:60]!r}... ({len(event_id)} chars)")
