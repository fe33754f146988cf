"""The `swe` environment: SWE-bench-style tasks solved with tools in a sandbox.

instance (the task's data), tool_calls (reading calls from completions), tools (bash, editor,
submit), prompt (the first message), workspace (repository set-up, diff, patching), env (the
Environment), grading (EVAL), log_parsers (test logs), sources (SWE-bench-family loaders),
gold (a task's gold patch as a script of tool calls).
"""
