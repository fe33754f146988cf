"""Whole-sandbox limits: memory and processes counted over all of a sandbox's processes.

rlimits (prlimit) bound each process alone: four processes may each use the memory limit. A
control group bounds them together. cgroup v2 is used where the owner's own group lets it make
children with the memory and pids controllers (a delegated subtree, or root); cgroup v1's memory
and pids hierarchies where they are writable (root). Elsewhere, typically an unprivileged owner
without delegation, the limits stay per process and one warning says so.

A command joins its group before bwrap starts (a shell writes its own pid to the group's
cgroup.procs, then execs bwrap), so everything it forks is counted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
_warned = False


def _own_paths() -> dict[str, str]:
    """This process's group per hierarchy: {"": v2 path, "memory": ..., "pids": ...}."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class SandboxCgroup:
    """The groups (one per v1 hierarchy, or one v2 group) holding one sandbox."""

    def __init__(self, groups: list[Path]) -> None:
        self.groups = groups

    def join_prefix(self) -> list[str]:
        """A command prefix that moves itself into the groups, then execs what follows."""
        script = ('while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
                  'exec "$@"')
        return ["sh", "-c", script, "join-cgroup",
                *(str(g / "cgroup.procs") for g in self.groups), "--"]

    def kill_and_remove(self) -> None:
        """SIGKILL whatever is still in the groups, then delete them."""
        for group in self.groups:
            for _ in range(50):
                try:
                    pids = (group / "cgroup.procs").read_text().split()
                except FileNotFoundError:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy: processes still exiting
                    time.sleep(0.02)


def _v2(name: str, own: str, memory: int, processes: int) -> SandboxCgroup | None:
    parent = CGROUP_ROOT / own.lstrip("/")
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    with contextlib.suppress(OSError):
        _write(parent / "cgroup.subtree_control", "+memory +pids")
    group = parent / name
    try:
        group.mkdir(exist_ok=True)
        _write(group / "memory.max", str(memory))
        with contextlib.suppress(OSError):
            _write(group / "memory.swap.max", "0")
        _write(group / "pids.max", str(processes))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return SandboxCgroup([group])


def _v1(name: str, own: dict[str, str], memory: int, processes: int) -> SandboxCgroup | None:
    memory_group = CGROUP_ROOT / "memory" / own.get("memory", "/").lstrip("/") / name
    pids_group = CGROUP_ROOT / "pids" / own.get("pids", "/").lstrip("/") / name
    made: list[Path] = []
    try:
        for group in (memory_group, pids_group):
            group.mkdir(exist_ok=True)
            made.append(group)
        _write(memory_group / "memory.limit_in_bytes", str(memory))
        if (memory_group / "memory.memsw.limit_in_bytes").exists():
            _write(memory_group / "memory.memsw.limit_in_bytes", str(memory))
        _write(pids_group / "pids.max", str(processes))
    except OSError:
        for group in made:
            with contextlib.suppress(OSError):
                group.rmdir()
        return None
    return SandboxCgroup([memory_group, pids_group])


def group_name(sandbox_id: str) -> str:
    return f"rollstream-{sandbox_id}"


def create(sandbox_id: str, memory_mb: int, max_processes: int) -> SandboxCgroup | None:
    """The sandbox's group with its limits, or None (limits per process only) where no group
    can be made here; the first None of a process is logged as a warning."""
    global _warned
    try:
        own = _own_paths()
    except OSError:
        own = {}
    name = group_name(sandbox_id)
    memory = memory_mb << 20
    found = None
    if "" in own:
        found = _v2(name, own[""], memory, max_processes)
    if found is None and {"memory", "pids"} <= own.keys():
        found = _v1(name, own, memory, max_processes)
    if found is None and not _warned:
        _warned = True
        log.warning("no writable cgroup here: sandbox memory and process limits apply per "
                    "process (rlimits), not to a sandbox as a whole")
    return found
