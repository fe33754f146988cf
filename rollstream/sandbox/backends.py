"""Which backend runs a sandbox, chosen by the process's sandbox settings (`--sandbox`,
ROLLSTREAM_SANDBOX=auto|bwrap|docker), and `Sandboxes`, which opens them.

`auto` (the default) gives a task that names an image a Docker container (it needs the image's
repository and toolchain), and a task without one a bubblewrap sandbox, falling back to Docker
(with ROLLSTREAM_SANDBOX_IMAGE) where bubblewrap is missing. A named backend is used for every
task, and its absence is an error that says why.

The settings and a job's quota are handed in (`Sandboxes(settings, quota)`): the stage that
plays or scores a job's episodes builds one and gives it to the environments it makes.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Protocol

from rollstream.sandbox import bwrap, docker
from rollstream.sandbox.base import Backend, Sandbox, SandboxError, SandboxSpec
from rollstream.sandbox.leases import sandbox_root
from rollstream.sandbox.settings import BACKEND_ENV, SandboxSettings

__all__ = ["BACKEND_ENV", "CHOICES", "Sandboxes", "SandboxQuota", "get_backend", "unavailable"]

CHOICES = ("auto", "bwrap", "docker")


class Held(Protocol):
    """One of a job's sandbox slots, held until released."""

    def release(self) -> None: ...


class SandboxQuota(Protocol):
    """A job's bound on its sandboxes open at once (rollstream.service.quotas.JobQuotas)."""

    @property
    def name(self) -> str:
        """The job's name, which labels its sandboxes."""
        ...

    async def sandbox_slot(self) -> Held | None:
        """A free slot of the job's, waited for; None: the job has no such quota."""
        ...


@cache
def unavailable(name: str) -> str | None:
    """Why backend `name` cannot run here (None: it can). Checked once per process."""
    return {"bwrap": bwrap.available, "docker": docker.available}[name]()


@cache
def get_backend(name: str, settings: SandboxSettings) -> Backend:
    """The backend instance called `name` under `settings`, one per process and settings (a
    bwrap backend keeps its uid pool and when it last swept)."""
    if name == "bwrap":
        return bwrap.BwrapBackend(sandbox_root(settings.root), settings.uids)
    if name == "docker":
        return docker.DockerBackend(image=settings.image)
    raise SandboxError(f"no sandbox backend {name!r}; known: bwrap, docker")


class Sandboxes:
    """Opens sandboxes under a process's sandbox settings; inside a fleet's job, labelled with
    the job and within its sandbox quota (`quota`)."""

    def __init__(self, settings: SandboxSettings, quota: SandboxQuota | None = None) -> None:
        self.settings = settings
        self.quota = quota

    def choice(self) -> str:
        choice = self.settings.backend.strip().lower() or "auto"
        if choice not in CHOICES:
            raise SandboxError(f"{BACKEND_ENV}={choice!r}; choose one of {', '.join(CHOICES)}")
        return choice

    def backend_name(self, image: str | None) -> str:
        """The backend for a task with (or without) an image, under the configured choice."""
        choice = self.choice()
        if choice != "auto":
            candidates = [choice]
        elif image is not None:
            candidates = ["docker"]
        else:
            candidates = ["bwrap", "docker"]
        reasons = []
        for name in candidates:
            reason = unavailable(name)
            if reason is None:
                return name
            reasons.append(f"{name}: {reason}")
        need = f"image {image!r}" if image else "a sandbox"
        raise SandboxError(f"no sandbox backend for {need} ({BACKEND_ENV}={choice}): "
                           + "; ".join(reasons))

    def backend(self, name: str) -> Backend:
        return get_backend(name, self.settings)

    async def create(self, spec: SandboxSpec) -> Sandbox:
        """A running sandbox from the backend the settings pick for `spec`. Under a job's
        sandbox quota it waits for a free slot of the job's, held until it is destroyed."""
        backend = self.backend(self.backend_name(spec.image))
        if self.quota is None:
            return await backend.create(spec)
        slot = await self.quota.sandbox_slot()
        try:
            sandbox = await backend.create(replace(spec, labels={**spec.labels,
                                                                  "job": self.quota.name}))
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        if slot is not None:
            sandbox.when_destroyed(slot.release)
        return sandbox
