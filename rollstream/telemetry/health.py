"""Liveness and readiness of a long-running process, for Kubernetes probes and Slurm checks.

Each part of a process that can be unready (a stage's consumer, the trainer's bridge, the
controller's policy reader, faust's worker) takes a `Component` and says what it is doing;
the process is ready when it has components and every one is. `metrics.serve` answers on its
port:

- `/health`: 200 while the process serves HTTP at all (alive);
- `/ready`: 200 when every component is ready (and there is one), else 503; the body (JSON)
  names each component with its state and, when unready, why.

A component starts unready. A fence (another live process took its id) keeps it unready for
FENCE_HOLD_S even if it joins again at once: a fight over one id is a misconfiguration to show
on the probe, not a blip to hide between two polls.
"""

from __future__ import annotations

import json
import threading
import time

FENCE_HOLD_S = 15.0

_lock = threading.Lock()
_components: dict[str, Component] = {}


class Component:
    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason: str | None = reason  # None: ready
        self.held_until = 0.0
        self.held_reason = ""

    def ready(self) -> None:
        self.reason = None

    def not_ready(self, reason: str) -> None:
        self.reason = reason

    def fenced(self, reason: str) -> None:
        """Unready now and for FENCE_HOLD_S, whatever `ready()` says meanwhile."""
        self.held_until = time.monotonic() + FENCE_HOLD_S
        self.held_reason = f"fenced: {reason}"
        self.reason = self.held_reason

    def state(self) -> str | None:
        """None when ready, else why not."""
        if time.monotonic() < self.held_until:
            return self.held_reason
        return self.reason

    def close(self) -> None:
        """The part is gone (a process that built it again takes a new one)."""
        with _lock:
            if _components.get(self.name) is self:
                del _components[self.name]


def component(name: str, reason: str = "starting") -> Component:
    """A new unready component named `name` (replacing one of that name)."""
    c = Component(name, reason)
    with _lock:
        _components[name] = c
    return c


def report() -> tuple[bool, bytes]:
    """Whether the process is ready, and the /ready body."""
    with _lock:
        states = {name: c.state() for name, c in sorted(_components.items())}
    # No component yet: the process is still starting (a trainer loading its model).
    ready = bool(states) and all(s is None for s in states.values())
    body = {"ready": ready,
            "components": {n: ("ready" if s is None else f"not ready: {s}")
                           for n, s in states.items()}}
    return ready, (json.dumps(body) + "\n").encode()
