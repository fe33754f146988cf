"""RUN: play an episode, turn by turn, against inference servers, checkpointing every turn.

The conversation lives as token ids: each turn appends the tokens of the new user message (the
chat-template delta) and the ids the server sampled, verbatim, so the trainer sees exactly what
was sampled. Where the chat template is not append-only (it re-renders earlier turns once a new
message follows), the turn starts a new sample (Turn.new_sample) holding the whole re-rendered
context; history is never silently re-tokenized. The template is the embedded policy's, or a
real model's from a local tokenizer directory (`--tokenizer-path`).

Inference goes through rollstream.inference.routing.Router: an episode stays on one server (prefix
cache), new episodes go to the least-loaded healthy server, and when every server is at its cap RUN
takes no new episodes (`capacity`, which the runtime checks before consuming). A turn (sampling,
retries, weight-update windows, failures, the Turn record, the checkpoint) is rollstream.turns',
shared with the recording gateway that plays harness environments
(rollstream.gateway.server): the environment's kind says which of the two plays an episode.

After every turn that turn is written to <p>.episode-state (a TurnCheckpoint keyed by
<episode id>/<turn index>, co-partitioned with <p>.episodes): a turn's checkpoint costs that turn,
not the trajectory so far. A RUN process that takes over a partition reads those turns back,
rebuilds each unfinished episode from them and resumes it where it stopped instead of replaying
it; a finished episode tombstones every one of its turn keys.

An episode that ends as an infra failure (every inference retry spent, its sandbox died: the
environment's recorded failure or a SandboxError) is played again from its start in a fresh
environment, up to `retries_infra` times: RUN writes it back to <p>.episodes as attempt + 1, in
the transaction that drops its checkpoints, instead of passing its trajectory on, so its group
waits for the new attempt. Its retries spent, the trajectory goes on with its attempt and EVAL
scores it infra. Environment errors (ENV_ERROR, an environment's "env" failure) are
deterministic and never retried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from rollstream.bounds import check_episode
from rollstream.cluster import kafka
from rollstream.config import InferenceSettings, Settings
from rollstream.contracts.codec import DecodeError, codec
from rollstream.contracts.events import (
    EPISODE,
    TRAJECTORY,
    TURN_CHECKPOINT,
    Episode,
    Task,
    Trajectory,
    Turn,
)
from rollstream.contracts.inference import EmbeddedChatTemplate
from rollstream.envs.base import Environment, EnvKind
from rollstream.envs.registry import UnknownEnv, get_env
from rollstream.gateway.server import Gateway
from rollstream.inference.chat import ChatTemplate
from rollstream.inference.routing import Router
from rollstream.runtime import EventContext, InvalidEvent, Output, Stage
from rollstream.sandbox import SandboxError, Sandboxes
from rollstream.service.quotas import JobQuotas
from rollstream.telemetry import metrics
from rollstream.turns import EpisodeEnded, Playing, Turns, now_ms

log = logging.getLogger("rollstream.run")

# Plays one episode of an environment to its end (an environment kind's player).
Player = Callable[[Environment, Trajectory, EventContext], Awaitable[None]]
# Builds a kind's player for the RUN stage it plays for (once the stage has started).
PlayerFactory = Callable[["RunStage"], Player]

# Players by environment kind (rollstream.envs.base.ENV_KINDS), registered with `player`, as
# verl registers its agent loops: RUN plays an episode with its environment kind's player.
PLAYERS: dict[EnvKind, PlayerFactory] = {}


def player(kind: EnvKind) -> Callable[[PlayerFactory], PlayerFactory]:
    """Register the decorated factory as the player of environments of `kind`."""

    def register(factory: PlayerFactory) -> PlayerFactory:
        if kind in PLAYERS:
            raise ValueError(f"a player for environment kind {kind!r} is registered already")
        PLAYERS[kind] = factory
        return factory

    return register


SYSTEM_PROMPT_KEY = "system_prompt"  # in Task.metadata: the task's system message


def conversation(task: Task, turns: list[Turn],
                 observation_role: str = "user") -> list[dict[str, str]]:
    """The episode as chat messages: the task's system prompt (Task.metadata["system_prompt"])
    if any, the task prompt, then each completion and observation. An environment whose
    observations are tool results (`observation_role = "tool"`) has them rendered as `tool`
    messages wherever the turn made a tool call; other observations stay `user` messages."""
    messages = []
    system = (task.get("metadata") or {}).get(SYSTEM_PROMPT_KEY)
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": task["prompt"]})
    for turn in turns:
        messages.append({"role": "assistant", "content": turn["completion_text"]})
        if turn["observation"] is not None:
            role = observation_role if turn.get("tool_call") else "user"
            messages.append({"role": role, "content": turn["observation"]})
    return messages


@dataclass
class Saved:
    """An unfinished episode as its checkpoints on <p>.episode-state left it."""

    # By turn index: the turn and the environment's state after it.
    turns: dict[int, tuple[Turn, str]] = field(default_factory=dict)
    started_at_ms: int = 0
    keys: int = 0  # turn keys written, replaced ones too: each gets a tombstone at the end
    # A whole-trajectory checkpoint keyed by the episode id, as releases before per-turn
    # checkpoints wrote them: its key gets a tombstone too when the episode ends.
    legacy: bool = False

    def add(self, checkpoint: dict) -> None:
        """A turn's checkpoint, in the order written. A turn index written again (the episode
        resumed by another process from an earlier turn) replaces that turn and any after it."""
        turn = checkpoint["turn"]
        index = turn["index"]
        for later in [i for i in self.turns if i >= index]:
            del self.turns[later]
        self.turns[index] = (turn, checkpoint["env_state"])
        self.keys = max(self.keys, index + 1)
        if checkpoint["previous_observation"] is not None and index - 1 in self.turns:
            self.turns[index - 1][0]["observation"] = checkpoint["previous_observation"]
        self.started_at_ms = checkpoint["started_at_ms"]

    def played(self) -> tuple[list[Turn], str]:
        """The turns from the first on, up to the first one missing (compaction can leave a
        replaced turn's later turns behind, from a process that lost the episode), and the
        environment's state after the last of them."""
        turns: list[Turn] = []
        state = "{}"
        while len(turns) in self.turns:
            turn, state = self.turns[len(turns)]
            turns.append(turn)
        return turns, state


# A record of <p>.episode-state: partition, key, record name and value (None, None: a tombstone).
StateRecord = tuple[int, str, str | None, dict | None]


def read_saved(partitions: Iterable[int], records: Iterable[StateRecord]
               ) -> dict[int, dict[str, Saved]]:
    """The unfinished episodes of these partitions from <p>.episode-state's records in the order
    written. Values are per-turn TurnCheckpoints, or an earlier release's whole Trajectory keyed
    by the episode id."""
    saved: dict[int, dict[str, Saved]] = {p: {} for p in partitions}
    for partition, key, record, value in records:
        episodes = saved[partition]
        if record == TRAJECTORY and value is not None:
            episodes[key] = Saved({t["index"]: (t, value["env_state"]) for t in value["turns"]},
                                  value["started_at_ms"], legacy=True)
        elif value is not None:
            episodes.setdefault(value["episode_id"], Saved()).add(value)
        elif key in episodes and episodes[key].legacy:  # the end of an earlier release's episode
            del episodes[key]
        else:
            episode, _, index = key.rpartition("/")
            found = episodes.get(episode)
            if found is not None and index.isdigit():
                found.turns.pop(int(index), None)
                if not found.turns and not found.legacy:
                    del episodes[episode]
    return saved


class RunStage(Stage[Episode]):
    name = "run"
    input_record = EPISODE

    def __init__(self, settings: Settings, template: ChatTemplate | None = None,
                 router: Router | None = None, share: Callable[[], int] | None = None,
                 quotas: JobQuotas | None = None) -> None:
        """`router`: inference servers shared with other RUN stages in this process (a fleet's
        jobs; the caller starts and closes it), else this stage's own from its settings;
        `share`: how many more episodes this stage may start now (a fleet's fair share of the
        shared servers, rollstream.service.fairshare), else what room the servers have;
        `quotas`: the job's inside a fleet (they pace its turns and bound its sandboxes)."""
        super().__init__(settings)
        self.inference = settings.inference
        self.quotas = quotas
        self.sandboxes = Sandboxes(settings.sandbox, quotas)
        self.template: ChatTemplate = template or self._template(settings.inference)
        self.router = router
        self._own_router = router is None
        self.share = share
        # Checkpoints of unfinished episodes, by input partition, then episode id.
        self.checkpoints: dict[int, dict[str, Saved]] = {}
        self.turns: Turns | None = None
        self.gateway: Gateway | None = None  # it listens from the first harness episode on
        self.players: dict[str, Player] = {}  # by environment kind

    @staticmethod
    def _template(settings: InferenceSettings) -> ChatTemplate:
        if not settings.tokenizer_path:
            if settings.chat_template or settings.chat_template_kwargs:
                raise ValueError("--chat-template and --chat-template-kwargs need "
                                 "--tokenizer-path (the embedded policy has one template)")
            return EmbeddedChatTemplate()
        from rollstream.inference.hf_template import HFChatTemplate  # tokenizers only when used

        try:
            kwargs = json.loads(settings.chat_template_kwargs or "{}")
        except ValueError as exc:
            raise ValueError(f"chat_template_kwargs is not JSON: {exc}") from exc
        if not isinstance(kwargs, dict):
            raise ValueError("chat_template_kwargs must be a JSON object, e.g. "
                             '{"enable_thinking": false}')
        return HFChatTemplate(settings.tokenizer_path, kwargs,
                              chat_template=settings.chat_template or None)

    def input_topic(self) -> str:
        return self.topics.episodes

    async def start(self) -> None:
        if self._own_router:
            self.router = Router.of(self.inference, adapter=self.inference.adapter,
                                    job=self.quotas.name if self.quotas else "")
            await self.router.start()
        assert self.router is not None
        self.turns = Turns(self.router, self.template, self.checkpoint, self.quotas)
        self.gateway = Gateway(self.turns, port=self.inference.gateway_port)
        self.players = {kind: make(self) for kind, make in PLAYERS.items()}

    async def close(self) -> None:
        if self._own_router and self.router is not None:
            await self.router.close()
        if self.gateway is not None:
            await self.gateway.close()

    def capacity(self) -> int | None:
        if self.router is None:
            return 0
        return self.router.capacity() if self.share is None else self.share()

    def stalled(self) -> bool:
        # Every episode waits for a server (the only one stopped with this job, say).
        return self.router is not None and self.router.slots() == 0

    # -- checkpoints -------------------------------------------------------------------------

    async def restore(self, partitions: list[int]) -> None:
        # Read in a thread: the episodes of the other partitions go on meanwhile.
        self.checkpoints.update(await asyncio.to_thread(self._read_checkpoints, partitions))

    def _read_checkpoints(self, partitions: list[int]) -> dict[int, dict[str, Saved]]:
        """The unfinished episodes' checkpoints on these partitions of <p>.episode-state."""
        tps = [TopicPartition(self.topics.episode_state, p, OFFSET_BEGINNING) for p in partitions]
        c = codec()

        def record(msg: Message) -> StateRecord:
            if msg.value() is None:
                return msg.partition(), msg.key().decode(), None, None
            name, value = c.decode(msg.value())
            if name not in (TURN_CHECKPOINT, TRAJECTORY):
                raise DecodeError(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: a {name} "
                                  "is not a checkpoint")
            return msg.partition(), msg.key().decode(), name, value

        return read_saved(partitions, map(record, kafka.read_partitions(self.settings, tps)))

    def on_revoke(self, partitions: list[int]) -> None:
        for p in partitions:
            self.checkpoints.pop(p, None)

    def checkpoint(self, ctx: EventContext, trajectory: Trajectory,
                   previous_observation: str | None) -> None:
        """Write the trajectory's last turn (with the previous turn's observation where that
        came after its own checkpoint) to <p>.episode-state."""
        turn = trajectory["turns"][-1]
        episode_id = trajectory["episode_id"]
        ctx.emit(Output(self.topics.episode_state, f"{episode_id}/{turn['index']}",
                        TURN_CHECKPOINT, {
                            "episode_id": episode_id,
                            "turn": turn,
                            "env_state": trajectory["env_state"],
                            "previous_observation": previous_observation,
                            "started_at_ms": trajectory["started_at_ms"],
                        }, partition=ctx.partition))

    def tombstones(self, partition: int, episode_id: str, turns: int,
                   legacy: bool) -> list[Output]:
        """The episode is done: a tombstone for each of its `turns` turn keys (and for a legacy
        whole-trajectory checkpoint's key)."""
        keys = [f"{episode_id}/{index}" for index in range(turns)]
        return [Output(self.topics.episode_state, key, None, None, partition=partition)
                for key in keys + ([episode_id] if legacy else [])]

    # -- the episode -------------------------------------------------------------------------

    async def handle(self, episode: Episode, ctx: EventContext) -> list[Output]:
        check_episode(episode, self.settings.bounds)  # at the door, also for episodes sent here
        task = episode["task"]
        episode_id = episode["episode_id"]
        try:
            env = get_env(task["env"], self.sandboxes)
        except UnknownEnv as exc:
            raise InvalidEvent(str(exc)) from exc
        saved = self.checkpoints.get(ctx.partition, {}).pop(episode_id, None)
        turns, env_state = saved.played() if saved is not None else ([], "{}")
        started = saved.started_at_ms if saved is not None and turns else None
        attempt = episode.get("attempt", 0)
        assert self.router is not None
        # Take a server before the first await, so capacity() counts this episode at once; a
        # resumed episode goes back to its server while that one is usable.
        self.router.pin(episode_id, prefer=turns[-1]["server"] if turns else None)
        try:
            # A resumed episode's task is its episode event's: checkpoints hold turns only.
            trajectory: Trajectory = {
                "episode_id": episode_id,
                "task": task,
                "sample_index": episode["sample_index"],
                "turns": turns,
                "termination": "RUNNING",
                "termination_detail": "",
                "env_state": env_state,
                "started_at_ms": started or now_ms(),
                "finished_at_ms": 0,
                "attempt": attempt,
            }
            try:
                if started is None:
                    trajectory["env_state"] = json.dumps(await env.reset(task))
                else:
                    log.info("resuming %s at turn %d", episode_id, len(turns))
                await self.players[env.kind](env, trajectory, ctx)
            except SandboxError as exc:  # the environment's sandbox failed, not the agent
                trajectory["termination"] = "INFRA_ERROR"
                trajectory["termination_detail"] = f"sandbox: {exc}"
            finally:
                # Also on cancellation (partition revoked): the next owner re-creates what it
                # needs.
                await env.close(task, json.loads(trajectory["env_state"]))
        finally:
            self.router.release(episode_id)
        trajectory["finished_at_ms"] = now_ms()
        # Done: its checkpoints are dropped (also those of turns a restarted harness did not
        # redo) in the transaction that writes the trajectory (or the next attempt) and passes
        # the episode.
        written = saved.keys if saved is not None else 0
        tombstones = self.tombstones(ctx.partition, episode_id,
                                     max(written, len(trajectory["turns"])),
                                     saved is not None and saved.legacy)
        failed = infra_failure(env, trajectory)
        if failed is not None:
            spent = attempt >= self.inference.retries_infra
            metrics.retried(spent)
            log.warning("%s attempt %d failed (infra: %s); %s", episode_id, attempt, failed,
                        "retries spent" if spent else "played again")
            if not spent:
                again: Episode = {**episode, "attempt": attempt + 1}
                return [*tombstones, Output(self.topics.episodes, episode_id, EPISODE, again,
                                            partition=ctx.partition)]
        return [*tombstones, Output(self.topics.trajectories, episode_id, TRAJECTORY, trajectory)]

    async def _play(self, env: Environment, trajectory: Trajectory, ctx: EventContext) -> None:
        """An environment that steps: RUN renders the conversation, samples, and hands each
        completion to `env.step`, until the step, the turn budget or a failure ends it."""
        assert self.turns is not None
        task = trajectory["task"]
        episode = Playing.resume(trajectory, ctx)

        def prompt(sample: np.ndarray) -> tuple[list[int], bool]:
            messages = conversation(task, trajectory["turns"], env.observation_role)
            return self.template.next_prompt(sample, messages)

        while trajectory["termination"] == "RUNNING":
            try:
                sampled = await self.turns.sample(episode, prompt)
            except EpisodeEnded:
                return
            env_started = time.perf_counter()
            step = await env.step(task, episode.state, sampled.completion.text)
            self.turns.record(episode, sampled, step, (time.perf_counter() - env_started) * 1000)


def infra_failure(env: Environment, trajectory: Trajectory) -> str | None:
    """What failed, where the episode ended as an infra failure (its termination, or a failure
    its environment recorded in its state); None otherwise."""
    if trajectory["termination"] == "INFRA_ERROR":
        return trajectory["termination_detail"]
    failure = env.failure(json.loads(trajectory["env_state"]))
    return failure[1] if failure is not None and failure[0] == "infra" else None


@player("steps")
def _steps(stage: RunStage) -> Player:
    """RUN's own loop: an environment that steps each completion."""
    return stage._play


@player("harness")
def _harness(stage: RunStage) -> Player:
    """A harness that runs its own loop against RUN's recording gateway."""
    assert stage.gateway is not None  # made in start(), before the players
    # The registry hands it only environments of its kind, harness environments.
    return cast(Player, stage.gateway.play)
