"""The repository inside a sandbox: build it, take its diff, apply a patch to it.

A snapshot (the repository's files) becomes a git repository with one commit made with a fixed
identity and date, so the same files always give the same commit id: the task's base_commit can
be checked. An image already holds its repository at /testbed. Either way the agent's patch is
`git diff` against the commit the episode started from, untracked files included, taken with a
separate index so the agent's own git state is left alone.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from rollstream.envs.swe.instance import SweInstance
from rollstream.sandbox import HARNESS_TIMEOUT_S, Sandbox

# Fixed so that a snapshot always yields the same commit id.
_GIT_IDENTITY = ("GIT_AUTHOR_NAME=rollstream GIT_AUTHOR_EMAIL=rollstream@localhost "
                 "GIT_COMMITTER_NAME=rollstream GIT_COMMITTER_EMAIL=rollstream@localhost "
                 "GIT_AUTHOR_DATE='2000-01-01T00:00:00+0000' "
                 "GIT_COMMITTER_DATE='2000-01-01T00:00:00+0000'")
_EXCLUDES = "__pycache__/\n*.pyc\n.pytest_cache/\n*.orig\n*.rej\n"
_INDEX = "/tmp/.rollstream-index"  # a private index: `git add -A` without touching the agent's
# git apply, then a three-way merge, then GNU patch with fuzz (SWE-bench's harness order).
APPLY_COMMANDS = (
    "git apply --verbose {patch}",
    "git apply --verbose --3way {patch}",
    "patch --batch --fuzz=5 -p1 -i {patch}",
)


class WorkspaceError(RuntimeError):
    """The task's repository could not be set up as described: an environment failure."""


@dataclass
class ApplyResult:
    applied: bool
    command: str  # the one that worked, or the last one tried
    log: str


async def _git(sandbox: Sandbox, script: str, what: str,
               timeout_s: float = HARNESS_TIMEOUT_S) -> str:
    result = await sandbox.exec(script, timeout_s=timeout_s)
    if not result.ok:
        raise WorkspaceError(f"{what} failed (exit {result.exit_code}): {result.text.strip()}")
    return result.text


async def commit_all(sandbox: Sandbox, message: str) -> str:
    """Commit everything in the work tree with the fixed identity; returns the commit id."""
    out = await _git(sandbox, f"git add -A && {_GIT_IDENTITY} git commit -q --allow-empty "
                              f"-m {shlex.quote(message)} && git rev-parse HEAD", "git commit")
    return out.strip().splitlines()[-1]


async def prepare(sandbox: Sandbox, instance: SweInstance) -> str:
    """Build the task's repository at the sandbox's workdir; returns the commit the agent
    starts from (its patch is the diff against it)."""
    if instance.snapshot is not None:
        root = sandbox.workdir.rstrip("/")
        await sandbox.write_files({f"{root}/{path}": text.encode()
                                   for path, text in instance.snapshot.items()})
        await _git(sandbox, "git init -q -b main", "git init")
        base = await commit_all(sandbox, f"{instance.repo} at its base commit")
        if instance.base_commit and base != instance.base_commit:
            raise WorkspaceError(f"the snapshot builds commit {base}, not the task's "
                                 f"base_commit {instance.base_commit}")
    else:
        base = (await _git(sandbox, "git rev-parse HEAD", "git rev-parse")).strip()
    await sandbox.write_file(f"{sandbox.workdir}/.git/info/exclude", _EXCLUDES.encode())
    if instance.setup_patch:
        result = await apply_patch(sandbox, instance.setup_patch, base, "setup")
        if not result.applied:
            raise WorkspaceError(f"the task's setup patch does not apply: {result.log}")
        base = await commit_all(sandbox, "task setup")
    return base


async def diff(sandbox: Sandbox, base: str, max_bytes: int) -> str:
    """The work tree against `base` as a git patch (new files included; binary as git's
    binary patches). Raises ValueError when it is over `max_bytes`."""
    script = (f"export GIT_INDEX_FILE={_INDEX}; git read-tree {base} && git add -A && "
              f"git diff --cached --binary {base}")
    result = await sandbox.exec(script, timeout_s=HARNESS_TIMEOUT_S,
                                 output_bytes=max_bytes + 1)
    if result.omitted_bytes:
        raise ValueError(f"the patch is larger than {max_bytes} bytes")
    if not result.ok:
        raise WorkspaceError(f"git diff failed: {result.text.strip()}")
    return result.text


async def reset(sandbox: Sandbox, base: str) -> None:
    await _git(sandbox, f"git reset -q --hard {base} && git clean -fdq", "git reset")


async def apply_patch(sandbox: Sandbox, patch: str, base: str, name: str) -> ApplyResult:
    """Apply `patch` to a clean `base`, trying each of APPLY_COMMANDS (the tree is reset before
    each retry); the result says which worked, or why the last one failed."""
    path = f"/tmp/{name}.patch"
    # git apply rejects a patch whose last line lacks its newline.
    await sandbox.write_file(path, patch.encode() if patch.endswith("\n") else
                             (patch + "\n").encode())
    log = []
    command = ""
    for i, template in enumerate(APPLY_COMMANDS):
        if i:
            await reset(sandbox, base)
        command = template.format(patch=path)
        result = await sandbox.exec(command, timeout_s=HARNESS_TIMEOUT_S)
        log.append(f"$ {command}\n{result.text.strip()}")
        if result.ok:
            return ApplyResult(True, command, "\n".join(log))
    await reset(sandbox, base)
    return ApplyResult(False, command, "\n".join(log))
