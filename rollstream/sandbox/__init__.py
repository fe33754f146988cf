"""Sandboxes for agent tools and test runs: one interface (base), two backends (bwrap, docker)
opened under the process's settings and a job's quota (backends.Sandboxes), leases so abandoned
sandboxes get reaped (leases), and the `rollstream sandbox list|sweep` commands (cli)."""

from rollstream.sandbox.backends import Sandboxes, get_backend
from rollstream.sandbox.base import (
    HARNESS_TIMEOUT_S,
    WORKDIR,
    Backend,
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from rollstream.sandbox.settings import SandboxSettings

__all__ = [
    "HARNESS_TIMEOUT_S",
    "WORKDIR",
    "Backend",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxSettings",
    "SandboxSpec",
    "Sandboxes",
    "get_backend",
]
