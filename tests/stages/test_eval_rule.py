"""EVAL scores how an episode ended before any environment does: a plug-in whose `evaluate`
forgets the termination rule still cannot turn an infra failure into a reward."""

from __future__ import annotations

import asyncio
import json

import pytest

from rollstream.config import Settings
from rollstream.envs import registry
from rollstream.envs.base import Environment, Score, StepResult
from rollstream.runtime import EventContext
from stages.eval import EvalStage
from tests.helpers.scored_factory import scored


class Forgetful(Environment):
    """A plug-in that rewards every episode, however it ended."""

    name = "forgetful"
    description = "rewards everything (forgets termination_score)"
    calls = 0

    async def reset(self, task: dict) -> dict:
        return {}

    async def step(self, task: dict, state: dict, completion_text: str) -> StepResult:
        return StepResult(None, True, None, {})

    async def evaluate(self, task: dict, trajectory: dict) -> Score:
        Forgetful.calls += 1
        return Score(1.0, "ok", {"says": "great"})

    def validate_task(self, task: dict) -> None:
        pass


@pytest.fixture
def forgetful(monkeypatch: pytest.MonkeyPatch) -> type[Forgetful]:
    # As an entry-point plug-in would be found, without installing a distribution.
    monkeypatch.setattr(registry, "_environments",
                        lambda: {**registry.BUILTINS, Forgetful.name: Forgetful})
    Forgetful.calls = 0
    return Forgetful


def _score(termination: str) -> dict:
    trajectory = scored("t", 0, None)["trajectory"]
    trajectory["task"]["env"] = Forgetful.name
    trajectory.update(termination=termination, termination_detail="why")
    ctx = EventContext(0, 0, lambda out: pytest.fail(f"unexpected emit {out}"))
    settings = Settings()
    outputs = asyncio.run(EvalStage(settings).handle(trajectory, ctx))
    [out] = [o for o in outputs if o.topic == settings.topics.scored]  # beside the seen marker
    assert isinstance(out.value, dict)
    return out.value


@pytest.mark.parametrize(("termination", "reward", "failure_class"), [
    ("INFRA_ERROR", None, "infra"),
    ("ENV_ERROR", None, "env"),
    ("TRUNCATED", 0.0, "truncated"),
    ("AGENT_ERROR", 0.0, "agent"),
])
def test_the_termination_decides_before_the_plugin(
        forgetful: type[Forgetful], termination: str, reward: float | None,
        failure_class: str) -> None:
    value = _score(termination)
    assert (value["reward"], value["failure_class"]) == (reward, failure_class)
    assert json.loads(value["verifier"]) == {"termination": termination, "detail": "why"}
    assert forgetful.calls == 0


@pytest.mark.parametrize("termination", ["DONE", "MAX_TURNS"])
def test_a_finished_episode_is_the_plugins_to_score(forgetful: type[Forgetful],
                                                    termination: str) -> None:
    value = _score(termination)
    assert (value["reward"], value["failure_class"]) == (1.0, "ok")
    assert forgetful.calls == 1
