"""Which backend runs a sandbox, chosen by configuration: ROLLSTREAM_SANDBOX=auto|bwrap|docker.

`auto` (the default) gives a task that names an image a Docker container (it needs the image's
repository and toolchain), and a task without one a bubblewrap sandbox, falling back to Docker
(with ROLLSTREAM_SANDBOX_IMAGE) where bubblewrap is missing. A named backend is used for every
task, and its absence is an error that says why.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from rollstream.sandbox import bwrap, docker
from rollstream.sandbox.base import Backend, Sandbox, SandboxError, SandboxSpec
from rollstream.sandbox.settings import BACKEND_ENV, current
from rollstream.service import quotas

__all__ = ["BACKEND_ENV", "CHOICES", "backend_name", "configured", "create_sandbox",
           "get_backend", "unavailable"]

CHOICES = ("auto", "bwrap", "docker")


@cache
def unavailable(name: str) -> str | None:
    """Why backend `name` cannot run here (None: it can). Checked once per process."""
    return {"bwrap": bwrap.available, "docker": docker.available}[name]()


@cache
def get_backend(name: str) -> Backend:
    """The process-wide backend instance called `name`."""
    backends: dict[str, type[Backend]] = {"bwrap": bwrap.BwrapBackend,
                                          "docker": docker.DockerBackend}
    return backends[name]()


def configured() -> str:
    choice = current().backend.strip().lower() or "auto"
    if choice not in CHOICES:
        raise SandboxError(f"{BACKEND_ENV}={choice!r}; choose one of {', '.join(CHOICES)}")
    return choice


def backend_name(image: str | None) -> str:
    """The backend for a task with (or without) an image, under the configured choice."""
    choice = configured()
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


async def create_sandbox(spec: SandboxSpec) -> Sandbox:
    """A running sandbox from the backend the configuration picks for `spec`. Inside a fleet's
    job it is labelled with the job and, under the job's sandbox quota, waits for a free slot
    of the job's, held until it is destroyed (rollstream.service.quotas)."""
    backend = get_backend(backend_name(spec.image))
    job = quotas.current()
    if job is None:
        return await backend.create(spec)
    slot = await job.sandbox_slot()
    try:
        sandbox = await backend.create(replace(spec, labels={**spec.labels,
                                                              "job": job.job["name"]}))
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    if slot is not None:
        sandbox.when_destroyed(slot.release)
    return sandbox
