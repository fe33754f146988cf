"""What a hostile agent tries against any sandbox, on each backend and, for bwrap, as a
non-root owner too: filling the disk past its quota (in the workspace, /tmp or /dev/shm; with
sparse files, fallocate, or files that take no space but an inode) and leaving processes
behind (a setsid daemon, a fork bomb) to spoil the rest of the episode. A write past the cap
fails, the sandbox stays usable, and an episode that fills its disk is the agent's failure."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from rollstream import config
from rollstream.sandbox import Limits, Sandboxes, SandboxSpec
from rollstream.sandbox.base import INODES_PER_MB
from rollstream.sandbox.bwrap import delete_tree
from tests.helpers.sandbox_helpers import as_nobody, backend, needs_bwrap, sandbox_root
from tests.helpers.swe_helpers import call, play, shipped

__all__ = ["backend", "sandbox_root"]

DISK = Limits(disk_mb=32, file_size_mb=512, timeout_s=60)
# Each step prints FULL when the quota stopped it, WROTE when a write landed outside the
# writable places; USABLE at the end when the sandbox still takes a write after cleanup.
ABUSE = r"""
fill() { for i in 1 2 3 4; do head -c 10000000 /dev/zero > "$1/fill$i" 2>/dev/null ||
         { echo "FULL $1"; return; }; done; echo "ROOM $1"; }
fill /testbed; fill /tmp; fill /dev/shm
rm -f /testbed/fill* /tmp/fill* /dev/shm/fill*
truncate -s 100M /testbed/sparse && echo SPARSE-MADE
dd if=/dev/zero of=/testbed/sparse bs=1M count=100 conv=notrunc 2>/dev/null || echo FULL sparse
rm -f /testbed/sparse
fallocate -l 100M /testbed/falloc 2>/dev/null || echo FULL fallocate
rm -f /testbed/falloc
head -c 10000000 /dev/zero > /testbed/one && for i in $(seq 20); do
    ln /testbed/one /testbed/link$i || echo LINK-FAILED; done && echo LINKED
rm -f /testbed/one /testbed/link*
mkdir /testbed/many; i=0
while [ $i -lt 20000 ]; do : > /testbed/many/$i 2>/dev/null || { echo "FULL inodes $i"; break; }
    i=$((i + 1)); done
rm -rf /testbed/many
for p in /x /var/tmp/x /usr/x /etc/x /root/x; do (: > $p) 2>/dev/null && echo "WROTE $p"; done
# docker's /dev is the engine's own small tmpfs, writable by the container's root: bounded
if (: > /dev/x) 2>/dev/null; then head -c 100000000 /dev/zero > /dev/x 2>/dev/null ||
    echo FULL /dev; rm -f /dev/x; else echo READONLY /dev; fi
head -c 1000000 /dev/zero > /testbed/after && echo USABLE
"""


def _sandboxes() -> Sandboxes:
    """Under the settings the fixtures put in the environment (the backend, the root)."""
    return Sandboxes(config.load().sandbox)


async def _abuse(limits: Limits) -> str:
    sandbox = await _sandboxes().create(SandboxSpec(limits=limits))
    try:
        result = await sandbox.exec(ABUSE, timeout_s=120)
    finally:
        await sandbox.destroy()
    assert result.exit_code == 0 and not result.timed_out, result.text
    return result.text


def _check_abuse(text: str) -> None:
    lines = text.splitlines()
    for place in ("/testbed", "/tmp", "/dev/shm", "sparse", "fallocate"):
        assert f"FULL {place}" in lines, text
    assert "FULL /dev" in lines or "READONLY /dev" in lines, text
    assert {"SPARSE-MADE", "LINKED", "USABLE"} <= set(lines), text  # hard links take no room
    inodes = [int(line.split()[-1]) for line in lines if line.startswith("FULL inodes")]
    assert inodes and inodes[0] <= DISK.disk_mb * INODES_PER_MB, text
    assert not [line for line in lines if line.startswith("WROTE")], text


def test_writes_past_the_disk_quota_fail_wherever_they_go(backend: str) -> None:
    _check_abuse(asyncio.run(_abuse(DISK)))


PROBE = """
import asyncio, json, sys
from rollstream.sandbox import Limits, SandboxSettings, Sandboxes, SandboxSpec
from rollstream.sandbox.base import INODES_PER_MB

async def main():
    sandboxes = Sandboxes(SandboxSettings(backend="bwrap", root=sys.argv[3]))
    sandbox = await sandboxes.create(SandboxSpec(limits=Limits(**json.loads(sys.argv[1]))))
    try:
        result = await sandbox.exec(sys.argv[2], timeout_s=120)
    finally:
        await sandbox.destroy()
    print(json.dumps([result.exit_code, result.timed_out, result.text]))

asyncio.run(main())
"""


@needs_bwrap
def test_a_non_root_owners_sandbox_has_a_disk_quota_too() -> None:
    prefix = as_nobody()
    if prefix is None:
        pytest.skip("no Python that an unprivileged user may run (root-owned virtualenv)")
    root = Path(tempfile.mkdtemp(prefix="rollstream-nobody-"))  # open to the other user
    project = Path(__file__).resolve().parents[2]
    try:
        root.chmod(0o777)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(project), "HOME": str(root)}
        limits = {"disk_mb": DISK.disk_mb, "file_size_mb": DISK.file_size_mb}
        probe = subprocess.run([*prefix, "-c", PROBE, json.dumps(limits), ABUSE, str(root)],
                               capture_output=True, text=True, env=env, timeout=300)
        assert probe.returncode == 0, probe.stderr
        assert "no disk quota" not in probe.stderr, probe.stderr  # the fallback's warning
        code, timed_out, text = json.loads(probe.stdout)
        assert code == 0 and not timed_out, text
        _check_abuse(text)
        assert not list(root.glob("bw-*"))
    finally:
        delete_tree(root)


def test_an_episode_that_fills_its_disk_is_the_agents_failure(backend: str) -> None:
    task = shipped("wordwrap")[0]
    # Nearly all of the disk at once, in files under the file-size limit (out of the diff, in
    # .git), then a real write into the work tree.
    fill = ("n=$(( ($(df --output=avail -k . | tail -1) * 1024 - (4 << 20)) / 3 )); "
            "for i in 1 2 3; do fallocate -l $n .git/fill$i; done; "
            "head -c 20000000 /dev/zero > big; echo exit $?")
    score, observations, state = asyncio.run(play(task, [
        call("bash", command=fill), call("bash", command="echo alive"), call("submit")]))
    # The agent is told (the command's output), or the episode ends on its broken repository
    # (the diff taken after the call could not be written).
    told = f"{observations[0]} {state['exit']}"
    assert "No space left" in told or "Out of diskspace" in told, told
    assert state["failure"] is None, state["failure"]
    assert (score.reward, score.failure_class) == (0.0, "agent"), score.verifier


# -- processes that outlive their command ------------------------------------------------------

# Each leaves processes whose command line holds LEFTOVER, for the next command to look for.
LEAVE_BEHIND = {
    "setsid_daemon": "setsid bash -c ': LEFTOVER; while :; do sleep 1; done' < /dev/null "
                     "> /dev/null 2>&1 & echo started",
    "fork_bomb": "(setsid bash -c ': LEFTOVER; f() { f | f & }; f' > /dev/null 2>&1 &); "
                 "sleep 2; echo started",
    "timed_out_daemon": "setsid bash -c ': LEFTOVER; while :; do sleep 1; done' & sleep 300",
}


@pytest.mark.parametrize("command", LEAVE_BEHIND.values(), ids=LEAVE_BEHIND.keys())
def test_nothing_a_command_started_outlives_it(backend: str, command: str) -> None:
    async def body():
        sandbox = await _sandboxes().create(
            SandboxSpec(limits=Limits(max_processes=64, timeout_s=10)))
        try:
            first = await sandbox.exec(command, timeout_s=5)
            # The next command forks as much as it needs, as if it were the first.
            after = await sandbox.exec(
                "for i in $(seq 30); do sleep 1 & done; wait; "
                "echo left $(ps -eo args= | grep -c '[L]EFTOVER')", timeout_s=30)
        finally:
            await sandbox.destroy()
        return first, after

    first, after = asyncio.run(body())
    assert "started" in first.text or first.timed_out, first.text
    assert after.ok and after.text.splitlines()[-1] == "left 0", after.text

