"""bwrap sandboxes: isolation (the escape suite), limits, output cap, timeouts, leases.

Every test runs under the `sandbox_root` fixture, which fails it if a sandbox directory or a
sandboxed process outlives it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rollstream.sandbox import Limits, SandboxError, SandboxSpec
from rollstream.sandbox.bwrap import BwrapBackend, BwrapSandbox, delete_tree
from rollstream.sandbox.leases import UidPool
from tests.helpers.sandbox_helpers import (
    as_nobody,
    live_sandboxes,
    needs_bwrap,
    processes_in,
    sandbox_root,
)

__all__ = ["sandbox_root"]  # the fixture, imported for pytest

pytestmark = needs_bwrap

LIMITS = Limits(memory_mb=512, max_processes=64, file_size_mb=16, output_bytes=4096,
                timeout_s=10)


def run(coro):
    return asyncio.run(coro)


async def _with_sandbox(root: Path, body, limits: Limits = LIMITS):
    backend = BwrapBackend(root)
    sandbox = await backend.create(SandboxSpec(limits=limits))
    try:
        return await body(sandbox)
    finally:
        await sandbox.destroy()


def in_sandbox(root: Path, command: str, **kwargs):
    async def body(sandbox: BwrapSandbox):
        return await sandbox.exec(command, **kwargs)
    return run(_with_sandbox(root, body))


# -- the escape suite --------------------------------------------------------------------------

def test_files_outside_the_workspace_are_out_of_reach(sandbox_root: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    project = Path(__file__).resolve().parents[2] / "README.md"
    result = in_sandbox(sandbox_root, f"cat {secret}; cat {project}; cat /etc/shadow; "
                                      "ls /root; echo x > /usr/evil; echo x > /etc/evil; "
                                      "ls /tmp; echo done")
    assert "s3cret" not in result.text
    assert "Rollstream" not in result.text  # the project's own files are not mounted
    for expected in (f"{secret}: No such file", f"{project}: No such file",
                     "/etc/shadow: No such file", "/usr/evil: Read-only file system",
                     "/etc/evil: Read-only file system"):
        assert expected in result.text
    assert result.text.rstrip().endswith("done")
    assert not Path("/usr/evil").exists()


PROC_PROBE = """
import asyncio, sys
from pathlib import Path
from rollstream.sandbox import SandboxSpec
from rollstream.sandbox.bwrap import BwrapBackend

async def main():
    sandbox = await BwrapBackend(Path(sys.argv[1])).create(SandboxSpec())
    try:
        result = await sandbox.exec("id -u; for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; "
                                    "echo; done 2>&1; echo ENV; env")
        print(result.text)
    finally:
        await sandbox.destroy()

asyncio.run(main())
"""


def test_a_non_root_owners_environment_is_not_readable_in_the_sandbox() -> None:
    prefix = as_nobody()
    if prefix is None:
        pytest.skip("no Python that an unprivileged user may run (root-owned virtualenv)")
    # Not under pytest's tmp_path: its parents are closed to other users.
    root = Path(tempfile.mkdtemp(prefix="rollstream-nobody-"))
    try:
        root.chmod(0o777)
        _probe_as(prefix, root)
    finally:
        delete_tree(root)


def _probe_as(prefix: list[str], root: Path) -> None:
    project = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(project), "HOME": str(root),
           "OWNER_SECRET": "hunter2-token"}
    probe = subprocess.run([*prefix, "-c", PROC_PROBE, str(root)], capture_output=True,
                           text=True, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr
    uid, _, rest = probe.stdout.partition("\n")
    if os.geteuid() == 0:
        assert uid == "65534"  # really run as an unprivileged owner (bwrap in a user namespace)
    assert "hunter2-token" not in probe.stdout and "OWNER_SECRET" not in probe.stdout
    # No host path of the owner in any cmdline or environment, but for the Python prefix the
    # sandbox binds at its own path (on PATH): in a checkout, the project's .venv.
    assert str(project) not in probe.stdout.replace(sys.prefix, "<python>")
    inside = dict(line.split("=", 1) for line in rest.split("ENV\n")[1].splitlines()
                  if "=" in line)
    assert set(inside) <= {"PATH", "HOME", "TMPDIR", "LANG", "TERM", "PAGER", "GIT_PAGER",
                           "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PWD", "SHLVL", "_",
                           "ROLLSTREAM_SANDBOX_DIR", "ROLLSTREAM_SANDBOX_COMMAND"}
    assert not list(root.glob("bw-*"))


def test_the_network_is_unreachable(sandbox_root: Path) -> None:
    # A server on the host's loopback: the sandbox has its own, empty network namespace.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        probe = textwrap.dedent(f"""
            import socket
            print("interfaces", [name for _, name in socket.if_nameindex()])
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3)
                print("connected")
            except OSError as exc:
                print("refused", type(exc).__name__)
        """)
        result = in_sandbox(sandbox_root, f"python -c '{probe}'")
    assert "connected" not in result.text
    assert "refused ConnectionRefusedError" in result.text
    assert "interfaces ['lo']" in result.text


def test_a_fork_bomb_hits_the_process_limit_and_leaves_nothing(sandbox_root: Path) -> None:
    # Children that stay alive, so the limit is reached whatever the scheduling; then the
    # classic bash bomb, stopped by the timeout if not by the limit.
    hold = ("python -c 'import os, time\nn = 0\ntry:\n    while True:\n"
            "        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
            "        n += 1\nexcept OSError as exc:\n    print(\"fork failed after\", n, exc)'")
    result = in_sandbox(sandbox_root, f"{hold}; echo survived")  # echo: a builtin, no fork
    assert "fork failed after" in result.text and "Resource temporarily unavailable" in result.text
    assert int(result.text.split("fork failed after")[1].split()[0]) < LIMITS.max_processes
    assert result.text.rstrip().endswith("survived")
    started = time.monotonic()
    in_sandbox(sandbox_root, ":(){ :|:& };:; sleep 1", timeout_s=3)
    assert time.monotonic() - started < 10
    assert not processes_in(sandbox_root)


def test_no_nested_user_namespace_whoever_owns_the_sandbox(sandbox_root: Path) -> None:
    # As root there is no user namespace for --disable-userns: the seccomp filter refuses them.
    result = in_sandbox(sandbox_root, textwrap.dedent("""
        unshare -U true && echo unshare-cli-worked
        python - <<'PY'
        import ctypes, os, threading
        libc = ctypes.CDLL(None, use_errno=True)
        print("unshare", libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))
        t = threading.Thread(target=print, args=("threads still start",))
        t.start(); t.join()
        pid = os.fork()  # plain fork still works (clone without CLONE_NEWUSER)
        if pid == 0:
            os._exit(7)
        print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        PY
        """))
    assert "unshare-cli-worked" not in result.text
    assert "unshare -1 Operation not permitted" in result.text, result.text
    assert "threads still start" in result.text and "child 7" in result.text


def test_allocating_past_the_memory_limit_fails_in_the_sandbox(sandbox_root: Path) -> None:
    result = in_sandbox(sandbox_root, "python -c 'bytearray(1 << 30)'")
    assert result.exit_code == 1 and not result.timed_out
    assert "MemoryError" in result.text


def test_memory_is_limited_for_the_whole_sandbox(sandbox_root: Path) -> None:
    async def body(sandbox: BwrapSandbox):
        if sandbox.group is None:
            pytest.skip("no writable cgroup here: memory is limited per process only (the "
                        "test above covers the per-process limit)")
        # Each alone is under the limit (256 MB); the four together are not.
        return await sandbox.exec(
            "for i in 1 2 3 4; do python -c 'b = bytearray(150 << 20); import time; "
            "time.sleep(2); print(\"held\")' & done; wait", timeout_s=60)
    result = run(_with_sandbox(sandbox_root, body, Limits(memory_mb=256, max_processes=64)))
    assert result.text.splitlines().count("held") <= 1, result.text
    assert "Killed" in result.text


def test_disk_is_limited_for_the_whole_sandbox(sandbox_root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("no disk quota for a non-root owner (documented); the per-file size "
                    "limit is tested above")
    limits = Limits(disk_mb=32, file_size_mb=512, timeout_s=30)
    # Each file is under the file-size limit; together they are over the disk.
    result = run(_with_sandbox(sandbox_root, lambda sandbox: sandbox.exec(
        "for f in a b /tmp/c /tmp/d; do head -c 12000000 /dev/zero > $f || echo failed $f; "
        # The files written, not all of /tmp: a checkout under /tmp has its Python bound there.
        "done; du -ck a b /tmp/c /tmp/d | tail -1"), limits))
    assert "No space left on device" in result.text, result.text
    assert int(result.text.split()[-2]) <= 32 * 1024


def test_without_a_writable_cgroup_limits_fall_back_with_one_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from rollstream.sandbox import cgroups

    # As for an unprivileged owner without delegation: no group can be made under this root.
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path / "absent")
    monkeypatch.setattr(cgroups, "_warned", False)
    with caplog.at_level("WARNING", logger=cgroups.__name__):
        assert cgroups.create("bw-a", 256, 64) is None
        assert cgroups.create("bw-b", 256, 64) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "per process" in warnings[0]


def test_100_mb_of_output_is_capped_head_and_tail(sandbox_root: Path) -> None:
    result = in_sandbox(sandbox_root, "echo START; head -c 100000000 /dev/zero | tr '\\0' x; "
                                      "echo; echo END")
    assert result.ok
    assert len(result.output) < LIMITS.output_bytes + 100
    assert result.output.startswith(b"START\nxxx") and result.output.endswith(b"xxx\nEND\n")
    assert result.omitted_bytes > 99_000_000
    assert b"bytes of output omitted" in result.output


def test_sleeping_past_the_timeout_kills_the_whole_tree(sandbox_root: Path) -> None:
    result = in_sandbox(sandbox_root, "sleep 300 & setsid sleep 300 & sleep 300", timeout_s=1)
    assert result.timed_out and result.exit_code == 128 + signal.SIGKILL
    assert result.duration_s < 5
    assert not processes_in(sandbox_root)


# Commands an RL policy may leave running: still printing at the timeout, or deaf to SIGTERM.
RUNAWAY = {
    "yes": "yes",
    "urandom": "base64 /dev/urandom",
    "ignores_sigterm": "trap '' TERM; (trap '' TERM; yes >/dev/null &); "
                       "while :; do echo still here; sleep 0.01; done",
}


@pytest.mark.parametrize("command", RUNAWAY.values(), ids=RUNAWAY.keys())
def test_a_command_still_printing_at_its_timeout_returns(sandbox_root: Path,
                                                         command: str) -> None:
    started = time.monotonic()
    # A large output limit keeps the reader busy copying when the timeout strikes.
    result = in_sandbox(sandbox_root, command, timeout_s=2, output_bytes=1 << 20)
    # Generous: a busy machine may be slow to kill, but a hang never returns at all.
    assert time.monotonic() - started < 2 + 10
    assert result.timed_out and not result.ok
    assert len(result.output) < (1 << 20) + 100
    assert not processes_in(sandbox_root)


def test_a_command_killed_while_it_starts_leaves_nothing(sandbox_root: Path) -> None:
    # Timeouts from 0 up to past bwrap's start-up: the kill lands at every stage of it (the
    # cgroup join, nsenter, bwrap before and after it forks the namespace's pid 1).
    async def body(sandbox: BwrapSandbox):
        return [await sandbox.exec("while :; do echo x; done", timeout_s=i / 100)
                for i in range(30)]

    results = run(_with_sandbox(sandbox_root, body))
    assert all(r.timed_out and not r.ok for r in results)
    assert not processes_in(sandbox_root)


def test_writing_past_the_file_size_limit_fails(sandbox_root: Path) -> None:
    result = in_sandbox(sandbox_root, "head -c 40000000 /dev/zero > big; echo rc=$?; "
                                      "stat -c %s big")
    assert "rc=153" in result.text or "File too large" in result.text  # SIGXFSZ, or EFBIG
    assert int(result.text.split()[-1]) <= LIMITS.file_size_mb << 20


# -- what tools rely on ------------------------------------------------------------------------

def test_workspace_persists_across_commands_but_processes_do_not(sandbox_root: Path) -> None:
    async def body(sandbox: BwrapSandbox):
        await sandbox.exec("echo kept > note.txt; mkdir -p /tmp/t && echo t > /tmp/t/x; "
                           "(sleep 300 &)")
        assert not processes_in(sandbox_root)  # the background sleep died with the command
        second = await sandbox.exec("cat note.txt /tmp/t/x; pwd")
        assert second.text.split() == ["kept", "t", "/testbed"]
        await sandbox.write_files({"/testbed/pkg/a.py": b"x = 1\n"})
        assert await sandbox.read_file("/testbed/pkg/a.py", 100) == b"x = 1\n"
        with pytest.raises(FileNotFoundError):
            await sandbox.read_file("/testbed/missing.py", 100)
        with pytest.raises(IsADirectoryError):
            await sandbox.read_file("/testbed/pkg", 100)
        with pytest.raises(ValueError, match="more than 3"):
            await sandbox.read_file("/testbed/pkg/a.py", 3)
        piped = await sandbox.exec("wc -c", stdin=b"12345")
        assert piped.text.strip() == "5"
    run(_with_sandbox(sandbox_root, body))


def test_the_sandbox_runs_the_projects_python_and_pytest(sandbox_root: Path) -> None:
    result = in_sandbox(sandbox_root, "python -c 'import sys, pytest; print(sys.prefix)'")
    assert result.ok, result.text
    assert result.text.strip() == sys.prefix


def test_a_destroyed_sandbox_is_an_infra_error(sandbox_root: Path) -> None:
    async def body():
        sandbox = await BwrapBackend(sandbox_root).create(SandboxSpec(limits=LIMITS))
        await sandbox.destroy()
        with pytest.raises(SandboxError, match="destroyed"):
            await sandbox.exec("true")
    run(body())


def test_a_command_cannot_fake_an_infra_failure(sandbox_root: Path) -> None:
    # bwrap's own setup errors look like this; only bwrap's status channel decides.
    result = in_sandbox(sandbox_root, "echo 'bwrap: Can not mount'; exit 1")
    assert result.exit_code == 1


HOSTILE_TREE = """python - <<'PY'
import os
for _ in range(2000):  # deeper than Python's recursion limit
    os.mkdir("d")
    os.chdir("d")
os.chdir("/testbed")
os.makedirs("many")
for i in range(5000):
    open(f"many/{i}", "w").close()
os.makedirs("locked/inner")
open("locked/inner/f", "w").close()
os.chmod("locked/inner", 0)
os.chmod("locked", 0)
print("made")
PY
"""


@pytest.mark.slow
def test_a_hostile_tree_is_removed_on_destroy_and_by_a_sweep(sandbox_root: Path) -> None:
    async def body():
        backend = BwrapBackend(sandbox_root)
        sandboxes = [await backend.create(SandboxSpec(limits=LIMITS)) for _ in range(2)]
        for sandbox in sandboxes:
            made = await sandbox.exec(HOSTILE_TREE, timeout_s=60)
            assert made.text.strip() == "made", made.text
        await sandboxes[0].destroy()  # deeper than Python's recursion limit: no RecursionError
        assert not sandboxes[0].directory.exists()
        # The other one as a sweep in a new process finds it: nothing may stop the sweep.
        return sandboxes[1]

    try:
        left = run(body())
        assert left.directory.exists()
        swept = subprocess.run([sys.executable, "-m", "rollstream.cli", "sandbox", "sweep", "--all",
                                "--backend", "bwrap"], capture_output=True, text=True,
                               timeout=120)
        assert swept.returncode == 0, swept.stderr
        assert f"removed bwrap sandbox {left.id}" in swept.stdout
        assert not left.directory.exists()
    finally:  # whatever failed, leave no tree that would break pytest's own tmp cleanup
        for directory in sandbox_root.glob("bw-*"):
            delete_tree(directory)


# -- leases ------------------------------------------------------------------------------------

OWNER = """
import asyncio, sys
from pathlib import Path
from rollstream.sandbox import SandboxSpec
from rollstream.sandbox.bwrap import BwrapBackend

async def main():
    sandbox = await BwrapBackend(Path(sys.argv[1])).create(SandboxSpec())
    print(sandbox.id, flush=True)
    await sandbox.exec("sleep 300")

asyncio.run(main())
"""


def test_a_sandbox_whose_owner_died_is_reaped_and_a_live_ones_is_kept(
        sandbox_root: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(sandbox_root)],
                             stdout=subprocess.PIPE, env={**os.environ}, text=True)
    assert owner.stdout is not None
    sandbox_id = owner.stdout.readline().strip()

    async def mine():
        backend = BwrapBackend(sandbox_root)
        live = await backend.create(SandboxSpec(limits=LIMITS))
        try:
            deadline = time.monotonic() + 10
            while not any(d.endswith(sandbox_id) for d in processes_in(sandbox_root).values()):
                assert time.monotonic() < deadline, "the owner's command never started"
                await asyncio.sleep(0.05)
            assert backend.reap() == []  # both owners alive: nothing to reap
            owner.kill()
            owner.wait()
            reaped = backend.reap()
            assert [lease.id for lease in reaped] == [sandbox_id]
            assert live_sandboxes(sandbox_root)[0] == [live.id]
        finally:
            await live.destroy()
    try:
        run(mine())
    finally:
        owner.kill()
        owner.wait()


def test_freeing_orphaned_uids_while_sandboxes_come_and_go(tmp_path: Path) -> None:
    """Another process claims and releases uids while this one frees orphans (a sweep before
    a create, as RUN and EVAL both do): nothing raises, orphans are freed, live claims stay."""
    pool = UidPool(tmp_path, first=100_000, count=64)
    (tmp_path / "bw-live").mkdir()
    live = pool.claim("bw-live")
    orphan = pool.claim("bw-gone")  # its directory is gone: its owner died before releasing
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            (tmp_path / "bw-churn").mkdir()
            uid = pool.claim("bw-churn")
            (tmp_path / "bw-churn").rmdir()  # as `remove` does: the directory, then the uid
            pool.release(uid, "bw-churn")

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        for _ in range(2000):
            pool.release_orphans()
    finally:
        stop.set()
        churner.join()
    links = {int(link.name): os.readlink(link) for link in pool.dir.iterdir()}
    assert links == {live: "bw-live"} and orphan not in links


def test_a_late_release_leaves_the_next_holder_of_its_uid_alone(tmp_path: Path) -> None:
    # A sweep frees a closing sandbox's uid between its directory's removal and its own
    # release; a new sandbox claims that uid; the late release must not free the new claim.
    pool = UidPool(tmp_path, first=100_000, count=1)
    uid = pool.claim("bw-closing")
    pool.release_orphans()  # bw-closing's directory is already gone
    (tmp_path / "bw-new").mkdir()
    assert pool.claim("bw-new") == uid
    pool.release(uid, "bw-closing")
    assert os.readlink(pool.dir / str(uid)) == "bw-new"
    pool.release(uid, "bw-new")
    assert not any(pool.dir.iterdir())


def test_sweep_cli_removes_only_abandoned_sandboxes(sandbox_root: Path) -> None:
    # Created by a process that then exits without destroying it: abandoned.
    subprocess.run([sys.executable, "-c", LEAVE_ONE_BEHIND, str(sandbox_root)], check=True)
    cli = [sys.executable, "-m", "rollstream.cli", "sandbox"]
    listed = subprocess.run([*cli, "list", "--backend", "bwrap"], capture_output=True,
                            text=True, check=True)
    assert "abandoned" in listed.stdout
    swept = subprocess.run([*cli, "sweep", "--backend", "bwrap"], capture_output=True,
                           text=True, check=True)
    assert swept.stdout.count("removed bwrap sandbox") == 1
    assert live_sandboxes(sandbox_root)[0] == []


LEAVE_ONE_BEHIND = """
import asyncio, sys
from pathlib import Path
from rollstream.sandbox import SandboxSpec
from rollstream.sandbox.bwrap import BwrapBackend

asyncio.run(BwrapBackend(Path(sys.argv[1])).create(SandboxSpec()))
"""
