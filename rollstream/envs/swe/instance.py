"""A SWE task as the `swe` environment reads it from Task.data: the SWE-bench instance fields,
plus how to build the workspace and run the tests. Loaders (sources.py) write this layout;
`SweInstance.from_task` checks it and names the field that is wrong.

Task.data keys:
    instance_id, repo, base_commit, problem_statement, gold_patch, test_patch  (SWE-bench)
    FAIL_TO_PASS, PASS_TO_PASS   lists of test ids (a JSON string holding a list is accepted)
    image            container image holding the repository at /testbed (docker), or null
    snapshot         {path: text} of the repository at base_commit (built into a fresh git
                     workspace: any backend), or null; one of image / snapshot is required
    setup_patch      applied and committed before the agent starts (SWE-smith's bug), or null
    test_cmd         the test command, test directives appended (default: pytest -rA)
    test_directives  files / modules the test command runs (default: files of test_patch)
    log_parser       name in log_parsers.PARSERS (default "pytest")
    expected_statuses  {test id: status}: resolved iff the parsed statuses match (R2E-Gym)
    eval_timeout_s   limit of the whole test run
    scaffold         ScaffoldConfig fields: observation cap, per-command timeout, token budget
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rollstream.envs.base import InvalidTask, task_data

DEFAULT_TEST_CMD = "python -m pytest -rA --tb=short -p no:cacheprovider"
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


@dataclass(frozen=True)
class ScaffoldConfig:
    """Limits of the agent loop (SWE-agent's defaults where it has one)."""

    max_observation_chars: int = 10_000  # head + tail of a long output are shown
    command_timeout_s: float = 30.0  # per bash command
    # Budget for prompt + completions + observations; counted as UTF-8 bytes / bytes_per_token
    # (the environment never sees token ids: exact for byte-level tokenizers such as the
    # embedded policy's, an over-count with BPE unless bytes_per_token is raised to ~3-4).
    max_total_tokens: int | None = None
    bytes_per_token: float = 1.0
    max_calls_per_turn: int = 8
    max_patch_bytes: int = 1_000_000

    @classmethod
    def from_data(cls, raw: Any) -> ScaffoldConfig:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise InvalidTask(f"task data field 'scaffold' must be an object, got {raw!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidTask(f"task data field 'scaffold.{unknown[0]}' is unknown; "
                              f"known: {', '.join(sorted(known))}")
        return cls(**raw)


def test_list(value: Any, field_name: str) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS: a list of test ids, or a JSON string of one (SWE-bench)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError as exc:
            raise InvalidTask(f"task data field {field_name!r} is not a JSON list: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidTask(f"task data field {field_name!r} must be a list of test ids")
    return value


def patch_files(patch: str) -> list[str]:
    """Paths a unified git diff touches (new paths for renames), in order, once each."""
    return list(dict.fromkeys(b for _, b in _DIFF_FILE.findall(patch)))


@dataclass(frozen=True)
class SweInstance:
    instance_id: str
    repo: str
    problem_statement: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    base_commit: str | None = None
    gold_patch: str = ""
    test_patch: str = ""
    image: str | None = None
    snapshot: dict[str, str] | None = None
    setup_patch: str | None = None
    test_cmd: str = DEFAULT_TEST_CMD
    test_directives: list[str] = field(default_factory=list)
    log_parser: str = "pytest"
    expected_statuses: dict[str, str] | None = None
    eval_timeout_s: float = 1800.0
    source: str = "swe-bench"
    scaffold: ScaffoldConfig = field(default_factory=ScaffoldConfig)

    @property
    def directives(self) -> list[str]:
        """What the test command runs: explicit directives, else the test patch's files."""
        return self.test_directives or patch_files(self.test_patch)

    def to_data(self) -> dict[str, Any]:
        data = asdict(self)
        data["FAIL_TO_PASS"] = data.pop("fail_to_pass")
        data["PASS_TO_PASS"] = data.pop("pass_to_pass")
        return data

    @classmethod
    def from_task(cls, task: dict) -> SweInstance:
        data = dict(task_data(task))
        for name in ("instance_id", "repo", "problem_statement"):
            if not isinstance(data.get(name), str) or not data[name]:
                raise InvalidTask(f"task data field {name!r} must be a non-empty string")
        kwargs: dict[str, Any] = {
            "fail_to_pass": test_list(data.pop("FAIL_TO_PASS", None), "FAIL_TO_PASS"),
            "pass_to_pass": test_list(data.pop("PASS_TO_PASS", []), "PASS_TO_PASS"),
            "scaffold": ScaffoldConfig.from_data(data.pop("scaffold", None)),
        }
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidTask(f"task data field {unknown[0]!r} is unknown to the swe env")
        try:
            instance = cls(**data, **kwargs)
        except TypeError as exc:
            raise InvalidTask(f"task data: {exc}") from exc
        if instance.image is None and instance.snapshot is None:
            raise InvalidTask("task data needs 'image' (a container with the repository) or "
                              "'snapshot' (the repository's files)")
        if instance.snapshot is not None and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in instance.snapshot.items()):
            raise InvalidTask("task data field 'snapshot' must map paths to file texts")
        if not instance.fail_to_pass and not instance.expected_statuses:
            raise InvalidTask("task data field 'FAIL_TO_PASS' is empty: nothing to resolve")
        return instance
