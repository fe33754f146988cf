"""SWE-bench-family loaders (field mapping, image names, test commands) through `publish`'s
formats, tool-call parsing, and the test-log parsers. No sandbox needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producers.publish import FORMATS, TaskFileError, load_tasks
from rollstream.contracts.tool_calls import MalformedCall, ToolCall, parse_tool_calls
from rollstream.envs.base import InvalidTask
from rollstream.envs.swe.instance import SweInstance
from rollstream.envs.swe.log_parsers import (
    get_parser,
    parse_django,
    parse_pytest,
    parse_sympy,
    register,
)

TEST_PATCH = ("diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n"
              "+++ b/tests/test_x.py\n@@ -1 +1,2 @@\n x = 1\n+y = 2\n")
SWE_BENCH = {
    "instance_id": "astropy__astropy-12907", "repo": "astropy/astropy", "base_commit": "d16b",
    "patch": "diff --git a/a.py b/a.py\n", "test_patch": TEST_PATCH,
    "problem_statement": "Nested compound models break separability.", "hints_text": "",
    "created_at": "2022-03-03", "version": "4.3", "environment_setup_commit": "298c",
    "FAIL_TO_PASS": json.dumps(["tests/test_x.py::test_a"]),
    "PASS_TO_PASS": json.dumps(["tests/test_x.py::test_b"]),
}


def write(path: Path, records: list[dict]) -> Path:
    if path.suffix == ".json":
        path.write_text(json.dumps(records))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def only(path: Path, fmt: str) -> tuple[dict, SweInstance]:
    (task,) = load_tasks(path, fmt)
    return task, SweInstance.from_task(task)


def test_every_family_is_a_publish_format() -> None:
    assert {"swe-bench", "swe-gym", "swe-smith", "r2e-gym"} <= set(FORMATS)


def test_swe_bench_instance_with_json_string_test_lists(tmp_path: Path) -> None:
    task, instance = only(write(tmp_path / "verified.jsonl", [SWE_BENCH]), "swe-bench")
    assert task["task_id"] == "astropy__astropy-12907" and task["env"] == "swe"
    assert "Nested compound models" in task["prompt"] and "<tool_call>" in task["prompt"]
    assert instance.fail_to_pass == ["tests/test_x.py::test_a"]
    assert instance.pass_to_pass == ["tests/test_x.py::test_b"]
    assert instance.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert instance.gold_patch == SWE_BENCH["patch"] and instance.base_commit == "d16b"
    assert instance.directives == ["tests/test_x.py"]
    assert "pytest -rA" in instance.test_cmd and "conda activate testbed" in instance.test_cmd


def test_django_uses_its_runner_and_module_directives(tmp_path: Path) -> None:
    record = {**SWE_BENCH, "instance_id": "django__django-11099", "repo": "django/django",
              "test_patch": TEST_PATCH.replace("tests/test_x.py", "tests/auth_tests/test_v.py")}
    _, instance = only(write(tmp_path / "d.json", [record]), "swe-bench")
    assert "runtests.py" in instance.test_cmd and instance.log_parser == "django"
    assert instance.directives == ["auth_tests.test_v"]


def test_swe_gym_lists_and_image(tmp_path: Path) -> None:
    record = {**SWE_BENCH, "instance_id": "getmoto__moto-5752", "repo": "getmoto/moto",
              "FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": []}
    _, instance = only(write(tmp_path / "gym.json", [record]), "swe-gym")
    assert instance.image == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-5752:latest"
    assert instance.fail_to_pass == ["tests/test_x.py::test_a"] and instance.source == "swe-gym"


def test_swe_smith_patch_creates_the_bug(tmp_path: Path) -> None:
    record = {"instance_id": "pylint-dev__astroid.b114f6b5.2496",
              "repo": "swesmith/pylint-dev__astroid.b114f6b5", "patch": "diff --git a/b.py",
              "FAIL_TO_PASS": ["tests/test_inference.py::test_f"],
              "PASS_TO_PASS": ["tests/test_other.py::test_g"],
              "image_name": "swesmith.x86_64.pylint-dev__astroid.b114f6b5",
              "problem_statement": "f-strings are not inferred."}
    _, instance = only(write(tmp_path / "smith.jsonl", [record]), "swe-smith")
    assert instance.setup_patch == "diff --git a/b.py" and instance.gold_patch == ""
    assert instance.image == record["image_name"]
    assert instance.directives == ["tests/test_inference.py", "tests/test_other.py"]


def test_r2e_gym_is_graded_against_expected_statuses(tmp_path: Path) -> None:
    record = {"repo_name": "aiohttp", "commit_hash": "f0d74880deec8fcd982bce",
              "docker_image": "namanjain12/aiohttp_final:f0d7",
              "problem_statement": "Cookies are dropped.",
              "expected_output_json": json.dumps({"test_a": "PASSED", "test_b": "FAILED"})}
    task, instance = only(write(tmp_path / "r2e.json", [record]), "r2e-gym")
    assert task["task_id"] == "aiohttp__f0d74880deec"
    assert instance.expected_statuses == {"test_a": "PASSED", "test_b": "FAILED"}
    assert instance.image == record["docker_image"] and instance.test_cmd == "bash run_tests.sh"


def test_parquet_files_load_the_same(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="parquet support needs pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "verified.parquet"
    pq.write_table(pa.Table.from_pylist([SWE_BENCH]), path)
    _, instance = only(path, "swe-bench")
    assert instance.instance_id == SWE_BENCH["instance_id"]


def test_overrides_and_errors_name_the_place(tmp_path: Path) -> None:
    record = {**SWE_BENCH, "rollstream": {"group_size": 8, "scaffold": {
        "command_timeout_s": 5}}}
    task, instance = only(write(tmp_path / "o.jsonl", [record]), "swe-bench")
    assert task["group_size"] == 8 and instance.scaffold.command_timeout_s == 5
    missing = {k: v for k, v in SWE_BENCH.items() if k != "problem_statement"}
    with pytest.raises(TaskFileError, match=r"m\.jsonl:1: missing field 'problem_statement'"):
        load_tasks(write(tmp_path / "m.jsonl", [missing]), "swe-bench")
    with pytest.raises(TaskFileError, match="snapshot folder .* does not exist"):
        load_tasks(write(tmp_path / "s.jsonl", [{**SWE_BENCH, "snapshot": "nope"}]),
                   "swe-bench")


def test_task_data_errors_name_the_field() -> None:
    base = {"instance_id": "x", "repo": "r", "problem_statement": "p", "FAIL_TO_PASS": ["t"]}
    with pytest.raises(InvalidTask, match="'image'.*or 'snapshot'"):
        SweInstance.from_task({"data": json.dumps(base)})
    with pytest.raises(InvalidTask, match="scaffold.turbo"):
        SweInstance.from_task({"data": json.dumps({**base, "image": "i",
                                                   "scaffold": {"turbo": 1}})})
    with pytest.raises(InvalidTask, match="'FAIL_TO_PASS' is not a JSON list"):
        SweInstance.from_task({"data": json.dumps({**base, "image": "i",
                                                   "FAIL_TO_PASS": "[oops"})})


# -- tool calls --------------------------------------------------------------------------------

def test_hermes_calls_several_and_unterminated() -> None:
    text = ('thinking...<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n'
            '</tool_call> and <tool_call>{"name": "submit", "arguments": "{}"}')
    assert parse_tool_calls(text) == [ToolCall("bash", {"command": "ls"}),
                                      ToolCall("submit", {})]


def test_openai_forms() -> None:
    message = {"tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "bash", "arguments": json.dumps({"command": "pwd"})}}]}
    assert parse_tool_calls(f"Sure. {json.dumps(message)}") == [ToolCall("bash",
                                                                         {"command": "pwd"})]
    bare = '```json\n{"name": "submit", "arguments": {}}\n```'
    assert parse_tool_calls(bare) == [ToolCall("submit", {})]


def test_malformed_calls_are_reported_not_raised() -> None:
    cases = {
        "<tool_call>{not json}</tool_call>": "invalid JSON",
        '<tool_call>["bash"]</tool_call>': "must be a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "no \"name\"",
        '<tool_call>{"name": "bash", "arguments": "{bad"}</tool_call>': "not valid JSON",
        '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>': "must be a JSON object",
    }
    for text, error in cases.items():
        (parsed,) = parse_tool_calls(text)
        assert isinstance(parsed, MalformedCall) and error in parsed.error, (text, parsed)
    assert parse_tool_calls("no calls here {\"x\": 1}") == []


# -- log parsers -------------------------------------------------------------------------------

def test_pytest_summary_lines() -> None:
    log = ("tests/test_a.py .F\n=== short test summary info ===\n"
           "PASSED tests/test_a.py::test_ok\n"
           "FAILED tests/test_a.py::test_bad - AssertionError: assert 1 == 2\n"
           "\x1b[31mERROR tests/test_a.py::test_err\x1b[0m\nXFAIL tests/test_a.py::test_x\n")
    assert parse_pytest(log) == {"tests/test_a.py::test_ok": "PASSED",
                                 "tests/test_a.py::test_bad": "FAILED",
                                 "tests/test_a.py::test_err": "ERROR",
                                 "tests/test_a.py::test_x": "XFAIL"}


def test_django_and_sympy_logs() -> None:
    django = ("test_a (auth_tests.test_v.T) ... ok\ntest_b (auth_tests.test_v.T) ... FAIL\n"
              "test_c (auth_tests.test_v.T) ... skipped 'no db'\n")
    assert parse_django(django) == {"test_a (auth_tests.test_v.T)": "PASSED",
                                    "test_b (auth_tests.test_v.T)": "FAILED",
                                    "test_c (auth_tests.test_v.T)": "SKIPPED"}
    assert parse_sympy("test_one ok\ntest_two F\ntest_three E\n") == {
        "test_one": "PASSED", "test_two": "FAILED", "test_three": "ERROR"}


def test_parser_registry() -> None:
    with pytest.raises(KeyError, match="unknown log parser 'tap'; known: django, pytest"):
        get_parser("tap")
    with pytest.raises(ValueError, match="already registered"):
        register("pytest", parse_pytest)
