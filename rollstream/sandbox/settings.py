"""The sandbox settings of this process: backend, default image, bwrap's root and uid range.

They are Rollstream settings like any other (rollstream.config: `--sandbox`, `--sandbox-image`,
`--sandbox-root`, `--sandbox-uids`, or ROLLSTREAM_SANDBOX* in the environment), given to this
package by the process at start (`configure`). Until then, as in a library or a test, they are
resolved from the environment by the same loader."""

from __future__ import annotations

from dataclasses import dataclass

BACKEND_ENV = "ROLLSTREAM_SANDBOX"
IMAGE_ENV = "ROLLSTREAM_SANDBOX_IMAGE"
ROOT_ENV = "ROLLSTREAM_SANDBOX_ROOT"
UIDS_ENV = "ROLLSTREAM_SANDBOX_UIDS"


@dataclass(frozen=True)
class SandboxSettings:
    backend: str = "auto"  # auto | bwrap | docker
    image: str = ""  # docker image for tasks that name none ("" : the local base image)
    root: str = ""  # where bwrap sandboxes live ("": a per-user temp folder)
    uids: str = ""  # FIRST-LAST: uids for the sandboxes of a root owner ("": the default range)


_configured: SandboxSettings | None = None


def configure(settings: SandboxSettings | None) -> None:
    """This process's sandbox settings (None: resolve them from the environment again)."""
    global _configured
    _configured = settings


def current() -> SandboxSettings:
    if _configured is not None:
        return _configured
    from rollstream import config  # the one loader: its environment variables are ours

    return config.load().sandbox_settings()
