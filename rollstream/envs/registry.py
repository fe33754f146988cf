"""Environments by name: the built-ins, plus third-party plug-ins from the `rollstream.envs`
entry-point group, e.g. in a plug-in's pyproject.toml:

    [project.entry-points."rollstream.envs"]
    my_env = "my_package.envs:MyEnv"      # an Environment subclass

A plug-in may not take a built-in's name (a task's `env` must mean the same thing everywhere).
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from rollstream.envs.arithmetic import Arithmetic
from rollstream.envs.base import ENV_KINDS, Environment
from rollstream.envs.copy_letter import CopyLetter
from rollstream.envs.guess_number import GuessNumber
from rollstream.envs.harness import HarnessEnv
from rollstream.envs.reverse import Reverse
from rollstream.envs.swe.env import SweEnv
from rollstream.sandbox import Sandboxes

ENTRY_POINT_GROUP = "rollstream.envs"

BUILTINS: dict[str, type[Environment]] = {
    env.name: env for env in (Arithmetic, CopyLetter, GuessNumber, HarnessEnv, Reverse, SweEnv)
}


class UnknownEnv(KeyError):
    """No environment has this name; the message lists the known ones."""

    def __str__(self) -> str:
        # KeyError would show the message in quotes.
        return str(self.args[0])


@cache
def _environments() -> dict[str, type[Environment]]:
    # Cached: scanning installed distributions costs milliseconds, and RUN looks up per task.
    found = dict(BUILTINS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTINS:
            raise RuntimeError(
                f"env plug-in {ep.name!r} ({ep.value}) takes the name of a built-in environment"
            )
        try:
            cls = ep.load()
        except Exception as exc:  # a broken plug-in: say which one
            raise RuntimeError(
                f"env plug-in {ep.name!r} ({ep.value}) failed to load: {exc}"
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise RuntimeError(
                f"env plug-in {ep.name!r} ({ep.value}) is not an Environment subclass"
            )
        if cls.kind not in ENV_KINDS:
            raise RuntimeError(f"env plug-in {ep.name!r} ({ep.value}) has kind {cls.kind!r}; "
                               f"known: {', '.join(ENV_KINDS)}")
        found[ep.name] = cls
    return found


def get_env(name: str, sandboxes: Sandboxes | None = None) -> Environment:
    """A new instance of the environment called `name`, opening its sandboxes from `sandboxes`
    (None: the process's settings); raises UnknownEnv listing known names."""
    envs = _environments()
    if name not in envs:
        raise UnknownEnv(f"unknown environment {name!r}; known: {', '.join(sorted(envs))}")
    return envs[name](sandboxes)


def list_envs() -> list[tuple[str, str]]:
    """(name, description) of every environment, sorted by name."""
    return [(name, cls.description) for name, cls in sorted(_environments().items())]
