"""The sandbox settings of a process: backend, default image, bwrap's root and uid range.

They are Rollstream settings like any other (rollstream.config: `--sandbox`, `--sandbox-image`,
`--sandbox-root`, `--sandbox-uids`, or ROLLSTREAM_SANDBOX* in the environment), resolved where a
command starts (`Settings.sandbox`) and handed to the sandboxes it opens
(rollstream.sandbox.backends.Sandboxes): this package never reads them on its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The environment variables of these settings, named in errors so the fix is clear.
BACKEND_ENV = "ROLLSTREAM_SANDBOX"
IMAGE_ENV = "ROLLSTREAM_SANDBOX_IMAGE"
ROOT_ENV = "ROLLSTREAM_SANDBOX_ROOT"
UIDS_ENV = "ROLLSTREAM_SANDBOX_UIDS"


def _setting(default: str, key: str, help: str) -> Any:
    # `key`: the setting's name in flags, files and the environment (rollstream.config).
    return field(default=default, metadata={"group": "sandbox", "key": key, "help": help})


@dataclass(frozen=True)
class SandboxSettings:
    """Where and how a process opens sandboxes."""

    backend: str = _setting("auto", "sandbox", "sandbox backend: auto (bwrap for tasks without "
                            "an image, docker for those with one), bwrap or docker")
    image: str = _setting("", "sandbox_image", "docker image for tasks that name none "
                          "(default: the local base image `make deps` builds)")
    root: str = _setting("", "sandbox_root", "folder bwrap sandboxes live in (default: a "
                         "per-user temp folder)")
    uids: str = _setting("", "sandbox_uids", "FIRST-LAST: uids for the sandboxes of a root "
                         "owner, one each (default 1000000-1065535)")
