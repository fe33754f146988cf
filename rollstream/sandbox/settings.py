"""The sandbox settings of a process: backend, default image, bwrap's root and uid range.

They are Rollstream settings like any other (rollstream.config: `--sandbox`, `--sandbox-image`,
`--sandbox-root`, `--sandbox-uids`, or ROLLSTREAM_SANDBOX* in the environment), resolved where a
command starts (`Settings.sandbox_settings()`) and handed to the sandboxes it opens
(rollstream.sandbox.backends.Sandboxes): this package never reads them on its own."""

from __future__ import annotations

from dataclasses import dataclass

# The environment variables of these settings, named in errors so the fix is clear.
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
