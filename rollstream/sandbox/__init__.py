"""Sandboxes for agent tools and test runs: one interface (base), two backends (bwrap, docker)
chosen by configuration (backends), leases so abandoned sandboxes get reaped (leases), and the
`rollstream sandbox list|sweep` commands (cli)."""

from rollstream.sandbox.backends import backend_name, create_sandbox, get_backend
from rollstream.sandbox.base import (
    WORKDIR,
    Backend,
    ExecResult,
    Limits,
    Sandbox,
    SandboxError,
    SandboxSpec,
)

__all__ = [
    "WORKDIR",
    "Backend",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "backend_name",
    "create_sandbox",
    "get_backend",
]
