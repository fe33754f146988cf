"""One agent turn as RUN records it, for both ways an episode is played: RUN's own loop (an
environment that steps each completion, stages/run.py) and the recording gateway (a harness
that runs its own loop, rollstream.gateway.server).

A turn is: the episode's turn budget checked; the prompt ids (the chat-template delta, or the
whole re-rendered context flagged as a new sample: history is never silently re-tokenized);
its token budget checked; the sample drawn through the router; the Turn recorded with the
sampled ids verbatim; the turn checkpointed to <p>.episode-state (that turn only, not the
trajectory so far).

Sampling goes through rollstream.inference.routing.Router. A failed call (timeout, refused,
5xx) is retried with backoff within RETRY_DELAYS_S, on another server when its own is down;
past the budget the episode ends as INFRA_ERROR, never as a reward. A server inside a weight
update (paused, or answering without a version) is waited for instead, for up to
UPDATE_WINDOW_S, without spending that budget. Past the budget, a turn whose last try found no
server usable at all (every one down or ejected: the only one restarting after a crash) waits
for one to come back, for up to OUTAGE_WINDOW_S: ending every in-flight episode as an infra
failure would throw their turns away for a restart that takes seconds. A completion whose
text is not the detokenization of its ids ends the episode as INFRA_ERROR too; one the server
finds too long as TRUNCATED. A request the server refuses for another reason (InferenceError)
is a bug, not the episode's doing: it is raised to the caller.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from rollstream.contracts.codec import pack_ids, pack_logprobs, unpack_ids
from rollstream.contracts.events import SamplingParams, Termination, Trajectory, Turn
from rollstream.envs.base import StepResult
from rollstream.inference.chat import ChatTemplate
from rollstream.inference.client import (
    Completion,
    ContextOverflow,
    InferenceUnavailable,
    ServerError,
    ServerUpdating,
    TextMismatch,
)
from rollstream.inference.detokenize import served_text
from rollstream.inference.routing import NoServer, Router
from rollstream.runtime import EventContext
from rollstream.service.quotas import JobQuotas
from rollstream.telemetry import metrics

log = logging.getLogger("rollstream.turns")

RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)  # the retry budget for a failing inference call
# How long a turn waits out a weight update (a paused server's 503, a response without a
# version) before that, too, counts as an infra failure; polled every UPDATE_POLL_S.
UPDATE_WINDOW_S = 900.0
UPDATE_POLL_S = 0.5
# How long a turn past its retry budget waits for some server to be usable again when none is
# (health checks bring an ejected server back), polled every UPDATE_POLL_S.
OUTAGE_WINDOW_S = 120.0

# (ids, new_sample) for the episode's current sample: the template's next prompt.
Prompt = Callable[[np.ndarray], tuple[list[int], bool]]
# Writes the trajectory's last turn to <p>.episode-state, with the previous turn's observation
# where that came only after its own checkpoint (a harness sends it with its next call).
Checkpoint = Callable[[EventContext, Trajectory, str | None], None]


def now_ms() -> int:
    return int(time.time() * 1000)


def ids_array(ids: Sequence[int] | np.ndarray = ()) -> np.ndarray:
    """Token ids as RUN holds a context: int32, 4 bytes an id (a list of Python ints takes 8
    to 36), for thousands of episodes of up to 32k ids each."""
    return np.asarray(ids, dtype=np.int32)


def sample_ids(turns: list[Turn]) -> np.ndarray:
    """The token ids of the current sample: from the last turn that started one."""
    start = max((i for i, t in enumerate(turns) if t.get("new_sample")), default=0)
    parts = [unpack_ids(turn[key]) for turn in turns[start:]
             for key in ("prompt_ids", "completion_ids")]
    return np.concatenate([ids_array(), *parts])


class EpisodeEnded(Exception):
    """The turn ended the episode (the trajectory's termination says how) instead of sampling.
    `__cause__` is the inference failure, where one ended it."""


@dataclass
class Playing:
    """An episode being played: its trajectory (each turn checkpointed once recorded), the ids
    of its current sample, its environment state, and the tokens it has used of its budget."""

    trajectory: Trajectory
    ctx: EventContext
    state: dict
    sample: np.ndarray = field(default_factory=ids_array)
    max_total_tokens: int | None = None  # prompt + completion ids of all its turns
    tokens: int = 0
    # The last turn's observation when it came after that turn's checkpoint, for the next one.
    late_observation: str | None = None

    @classmethod
    def resume(cls, trajectory: Trajectory, ctx: EventContext) -> Playing:
        """The episode where its trajectory (new, or read back from a checkpoint) stopped."""
        return cls(trajectory, ctx, json.loads(trajectory["env_state"]),
                   sample_ids(trajectory["turns"]))

    def end(self, termination: Termination, detail: str) -> None:
        self.trajectory["termination"] = termination
        self.trajectory["termination_detail"] = detail


@dataclass
class Sampled:
    """A turn's sample, not recorded yet."""

    prompt_ids: list[int]
    new_sample: bool
    started_ms: int
    completion: Completion


class Turns:
    """Takes the turns of the episodes one RUN process plays: sample, record, checkpoint."""

    def __init__(self, router: Router, template: ChatTemplate, checkpoint: Checkpoint,
                 quotas: JobQuotas | None = None) -> None:
        """`quotas`: the job's, inside a fleet (its turns-per-second quota paces the turns)."""
        self.router, self.template, self.checkpoint = router, template, checkpoint
        self.quotas = quotas

    async def sample(self, episode: Playing, prompt: Prompt,
                     observation: str | None = None) -> Sampled:
        """The next turn's sample; raises EpisodeEnded where the episode ends instead.
        `observation`: what answered the previous turn, where it comes with this turn's prompt
        (a harness's messages) instead of from the environment's step."""
        trajectory = episode.trajectory
        turns = trajectory["turns"]
        if len(turns) >= trajectory["task"]["max_turns"]:
            episode.end("MAX_TURNS", f"{len(turns)} turns")
            raise EpisodeEnded()
        prompt_ids, new_sample = prompt(episode.sample)
        if new_sample:  # never at the first turn: there is no history to re-render
            log.info("%s: turn %d does not extend the recorded sample; new sample",
                     trajectory["episode_id"], len(turns))
            episode.sample = ids_array()
        budget = episode.max_total_tokens
        if budget is not None and episode.tokens + len(prompt_ids) > budget:
            episode.end("TRUNCATED", f"token budget of {budget} spent")
            raise EpisodeEnded()
        if observation is not None and turns:
            turns[-1]["observation"] = observation
            episode.late_observation = observation
        if self.quotas is not None:
            await self.quotas.turn()  # its turns-per-second quota
        started = now_ms()
        try:
            # The context sent lives while the turn decodes, and not in the Sampled: a caller's
            # last one is still alive while its next turn decodes.
            completion = await self.complete(
                np.concatenate((episode.sample, ids_array(prompt_ids))), trajectory, len(turns))
        except ContextOverflow as exc:
            episode.end("TRUNCATED", str(exc))
            raise EpisodeEnded() from exc
        except (InferenceUnavailable, TextMismatch) as exc:  # retries spent; a broken proxy
            episode.end("INFRA_ERROR", str(exc))
            raise EpisodeEnded() from exc
        return Sampled(prompt_ids, new_sample, started, completion)

    def record(self, episode: Playing, sampled: Sampled, step: StepResult,
               env_ms: float) -> None:
        """Record the turn and what the environment made of it; checkpoint the episode, or
        end it as DONE where the step is the last."""
        trajectory = episode.trajectory
        turns = trajectory["turns"]
        completion = sampled.completion
        turns.append(turn_record(len(turns), sampled, step, env_ms))
        metrics.turn(len(completion.token_ids))
        episode.sample = np.concatenate((episode.sample, ids_array(sampled.prompt_ids),
                                         ids_array(completion.token_ids)))
        episode.tokens += len(sampled.prompt_ids) + len(completion.token_ids)
        episode.state = step.state
        trajectory["env_state"] = json.dumps(step.state)
        if step.done:
            episode.end("DONE", "")
        else:
            self.checkpoint(episode.ctx, trajectory, episode.late_observation)
            episode.late_observation = None

    async def complete(self, prompt_ids: np.ndarray, trajectory: Trajectory,
                       turn: int) -> Completion:
        sampling = trajectory["task"]["sampling"].copy()
        seed = sampling.get("seed")
        if seed is not None:
            # Distinct but reproducible per sample and turn.
            sampling["seed"] = seed + 1000 * trajectory["sample_index"] + turn
        completion = await self._sample(prompt_ids, sampling, trajectory["episode_id"])
        # The assistant message is built from `text`, the sample from the ids: they must agree
        # (a proxy that leaves the stop token in `text` would add a second one, silently).
        sampled = completion.token_ids
        if completion.finish_reason == "stop" and sampled:
            sampled = sampled[:-1]  # the stop token, which `text` leaves out
        expected = self.template.decode(sampled)
        if completion.text != expected:
            # Ending inside a multi-byte character: vLLM's incremental detokenizer never
            # writes that tail (a plain decode, the embedded server's, shows U+FFFD).
            expected = served_text(self.template.decode, sampled)
        if completion.text != expected:
            raise TextMismatch(
                f"{completion.server}: the completion's text is not the detokenization of "
                f"its token ids (text {completion.text[-80:]!r}, ids decode to "
                f"{expected[-80:]!r}); check skip_special_tokens / "
                f"spaces_between_special_tokens on any proxy in between")
        return completion

    async def _sample(self, prompt_ids: np.ndarray, sampling: SamplingParams,
                      episode_id: str) -> Completion:
        last: Exception | None = None
        delays = iter(RETRY_DELAYS_S)
        window_ends = time.monotonic() + UPDATE_WINDOW_S
        outage_ends: float | None = None  # once the budget is spent with no server usable
        while True:
            try:
                return await self.router.complete(episode_id, prompt_ids, sampling,
                                                  self.template.stop_token_ids)
            except ServerUpdating as exc:
                # A weight update is not a failure: wait it out without spending the budget.
                last = exc
                if time.monotonic() >= window_ends:
                    break
                await asyncio.sleep(UPDATE_POLL_S)
            except ServerError as exc:
                last = exc
                delay = next(delays, None)
                if delay is not None:
                    metrics.inference_retry(exc.server)
                elif isinstance(exc, NoServer):  # an outage of every server: wait for one
                    outage_ends = outage_ends or time.monotonic() + OUTAGE_WINDOW_S
                    if time.monotonic() >= outage_ends:
                        break
                    delay = UPDATE_POLL_S
                else:
                    break
                await asyncio.sleep(delay)
        waited = ("" if outage_ends is None
                  else f", then none was usable for {OUTAGE_WINDOW_S:.0f} s")
        raise InferenceUnavailable(
            f"inference failed {len(RETRY_DELAYS_S) + 1} times{waited}: {last}")


def turn_record(index: int, sampled: Sampled, step: StepResult, env_ms: float) -> Turn:
    """The Turn record: the ids as sampled, the environment's answer, where and when."""
    completion = sampled.completion
    assert completion.policy_version is not None  # the router always stamps one
    return {
        "index": index,
        "prompt_ids": pack_ids(sampled.prompt_ids),
        "completion_ids": pack_ids(completion.token_ids),
        "logprobs": pack_logprobs(completion.logprobs),
        "policy_version": completion.policy_version,
        "adapter": completion.adapter,
        "finish_reason": completion.finish_reason,
        "completion_text": completion.text,
        "tool_call": step.tool_call,
        "observation": step.observation,
        "server": completion.server,
        "started_at_ms": sampled.started_ms,
        "inference_ms": completion.latency_ms,
        "env_ms": env_ms,
        "new_sample": sampled.new_sample,
    }
