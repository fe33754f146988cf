"""SWE-bench-family task files → Task dicts for the `swe` environment (`rollstream publish
--format swe-bench|swe-gym|r2e-gym|swe-smith FILE`). Files are JSON (a list of instances), JSONL
or parquet (needs pyarrow), as the datasets are published; nothing is downloaded.

Field mapping (instance → Task):
    task_id          instance_id (R2E-Gym: repo_name + "__" + commit_hash[:12] when absent)
    prompt           render_prompt: the tools and the problem statement
    data             SweInstance fields (see instance.py):
      FAIL_TO_PASS / PASS_TO_PASS   JSON strings (SWE-bench) or lists (SWE-Gym, SWE-smith)
      gold_patch     `patch` (SWE-bench, SWE-Gym); SWE-smith's `patch` creates the bug, so it is
                     the setup_patch and there is no gold; R2E-Gym has none
      image          SWE-bench: swebench/sweb.eval.x86_64.<id, "__" → "_1776_">:latest
                     SWE-Gym:   xingyaoww/sweb.eval.x86_64.<id, "__" → "_s_">:latest
                     SWE-smith: image_name;  R2E-Gym: docker_image;  an `image` field wins
      snapshot       a `snapshot` field naming a folder (relative to the file) holding the
                     repository's files: read into the task, no image needed (examples/swe)
      test_cmd       pytest -rA in the image's `testbed` conda env; django's runtests.py and
                     sympy's bin/test for those repositories (as SWE-bench's harness runs them);
                     R2E-Gym: run_tests.sh, graded against expected_output_json
    group_size, max_turns, sampling, metadata: DEFAULTS, overridden by an instance's
    optional `rollstream` object (e.g. {"group_size": 8, "scaffold": {...}}).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rollstream.envs.base import InvalidTask
from rollstream.envs.swe.instance import ScaffoldConfig, SweInstance, patch_files, test_list
from rollstream.envs.swe.prompt import render_prompt

DEFAULTS: dict[str, Any] = {
    "group_size": 4,
    "max_turns": 30,
    "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 2048,
                 "seed": None},
}
CONDA = "source /opt/miniconda3/bin/activate && conda activate testbed && "
PYTEST = "pytest -rA --tb=short -p no:cacheprovider"
# Test commands of repositories that do not run under pytest: (command, parser, directive map).
REPO_TESTS: dict[str, tuple[str, str, Callable[[str], str]]] = {
    "django/django": ("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1",
                      "django",
                      lambda path: path.removeprefix("tests/").removesuffix(".py")
                      .replace("/", ".")),
    "sympy/sympy": ("bin/test -C --verbose", "sympy", lambda path: path),
}

Record = dict[str, Any]


class SourceError(ValueError):
    """A task file or one of its records cannot be read; the message says where and why."""


# -- reading files ---------------------------------------------------------------------------

def read_records(path: Path) -> Iterator[tuple[str, Record]]:
    """(location, record) for every instance in a JSON, JSONL or parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SourceError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)")\
                from None
        for i, record in enumerate(pq.read_table(path).to_pylist()):
            yield f"{path}:row {i}", record
    elif suffix == ".json":
        items = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(items, list):
            raise SourceError(f"{path}: expected a JSON list of instances")
        for i, record in enumerate(items):
            yield f"{path}:[{i}]", record
    else:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    try:
                        yield f"{path}:{number}", json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise SourceError(f"{path}:{number}: invalid JSON: {exc.msg}") from None


def read_snapshot(folder: Path) -> dict[str, str]:
    """The files of a repository folder (UTF-8 text), by path relative to it."""
    if not folder.is_dir():
        raise SourceError(f"snapshot folder {folder} does not exist")
    return {p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


# -- one mapping per source --------------------------------------------------------------------

def _tests(record: Record, repo: str, directives: list[str]) -> dict[str, Any]:
    if repo in REPO_TESTS:
        command, parser, to_directive = REPO_TESTS[repo]
        return {"test_cmd": CONDA + command, "log_parser": parser,
                "test_directives": [to_directive(d) for d in directives]}
    return {"test_cmd": CONDA + PYTEST, "test_directives": directives}


def _common(record: Record) -> dict[str, Any]:
    return {"instance_id": record["instance_id"], "repo": record["repo"],
            "problem_statement": record["problem_statement"],
            "fail_to_pass": test_list(record.get("FAIL_TO_PASS"), "FAIL_TO_PASS"),
            "pass_to_pass": test_list(record.get("PASS_TO_PASS", []), "PASS_TO_PASS")}


def _swe_bench_like(record: Record, image_sep: str, source: str) -> dict[str, Any]:
    test_patch = record.get("test_patch", "")
    fields = {**_common(record), "base_commit": record.get("base_commit"),
              "gold_patch": record.get("patch", ""), "test_patch": test_patch,
              "source": source}
    image_id = record["instance_id"].replace("__", image_sep).lower()
    owner = "swebench" if source == "swe-bench" else "xingyaoww"
    fields["image"] = f"{owner}/sweb.eval.x86_64.{image_id}:latest"
    fields.update(_tests(record, record["repo"], patch_files(test_patch)))
    return fields


def swe_bench(record: Record) -> dict[str, Any]:
    return _swe_bench_like(record, "_1776_", "swe-bench")


def swe_gym(record: Record) -> dict[str, Any]:
    return _swe_bench_like(record, "_s_", "swe-gym")


def swe_smith(record: Record) -> dict[str, Any]:
    tests = test_list(record.get("FAIL_TO_PASS"), "FAIL_TO_PASS") + test_list(
        record.get("PASS_TO_PASS", []), "PASS_TO_PASS")
    files = list(dict.fromkeys(t.split("::", 1)[0] for t in tests))
    return {**_common(record), "setup_patch": record["patch"], "image": record["image_name"],
            "source": "swe-smith", "test_cmd": CONDA + PYTEST, "test_directives": files}


def r2e_gym(record: Record) -> dict[str, Any]:
    expected = record["expected_output_json"]
    if isinstance(expected, str):
        expected = json.loads(expected)
    instance_id = record.get("instance_id") or (
        f"{record['repo_name']}__{record['commit_hash'][:12]}")
    return {"instance_id": instance_id, "repo": record["repo_name"],
            "problem_statement": record["problem_statement"], "fail_to_pass": [],
            "pass_to_pass": [], "base_commit": record.get("commit_hash"),
            "image": record["docker_image"], "expected_statuses": expected,
            "test_cmd": "bash run_tests.sh", "source": "r2e-gym"}


SOURCES: dict[str, Callable[[Record], dict[str, Any]]] = {
    "swe-bench": swe_bench, "swe-gym": swe_gym, "swe-smith": swe_smith, "r2e-gym": r2e_gym,
}


def to_task(source: str, record: Record, base_dir: Path) -> dict[str, Any]:
    """A candidate Task for `record` of `source` (publish validates it like any other)."""
    try:
        fields = SOURCES[source](record)
    except KeyError as exc:
        raise SourceError(f"missing field {exc.args[0]!r} (a {source} instance)") from None
    except (InvalidTask, json.JSONDecodeError) as exc:
        raise SourceError(str(exc)) from None
    if record.get("image"):
        fields["image"] = record["image"]
    snapshot = record.get("snapshot")
    if isinstance(snapshot, str):  # a folder next to the file: the repository, no image
        fields["snapshot"] = read_snapshot(base_dir / snapshot)
        fields["image"] = None
        fields["test_cmd"] = "python -m " + PYTEST
    overrides = dict(record.get("rollstream") or {})
    if "scaffold" in overrides:
        fields["scaffold"] = ScaffoldConfig.from_data(overrides.pop("scaffold"))
    instance = SweInstance(**fields)
    return {"task_id": instance.instance_id, "env": "swe", "prompt": render_prompt(instance),
            "data": instance.to_data(), **DEFAULTS, **overrides}


def loader(source: str) -> Callable[[Path], Iterator[tuple[str, dict[str, Any]]]]:
    """A producers.publish loader for `source`: (location, candidate Task) per instance."""
    def load(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
        for where, record in read_records(path):
            if not isinstance(record, dict):
                raise SourceError(f"{where}: expected a JSON object")
            try:
                yield where, to_task(source, record, path.parent)
            except (SourceError, OSError) as exc:
                raise SourceError(f"{where}: {exc}") from None
    return load
