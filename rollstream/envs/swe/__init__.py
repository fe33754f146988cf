"""The `swe` environment: SWE-bench-style tasks solved with tools in a sandbox.

instance (the task's data), tools (bash, editor, submit), prompt (the first message), workspace
(repository set-up, diff, patching), env (the Environment), grading (EVAL), log_parsers (test
logs), sources (SWE-bench-family loaders), gold (a task's gold patch as a script of tool calls).
Tool calls are read from completions with
rollstream.contracts.tool_calls, which the recording gateway uses too.
"""
