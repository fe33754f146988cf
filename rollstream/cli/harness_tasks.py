"""`rollstream harness-tasks`: SWE instances as `harness` tasks for `rollstream publish`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def harness_tasks_command(args: argparse.Namespace) -> int:
    from producers.publish import TaskFileError, load_tasks, validate_task
    from rollstream.envs import mini_swe_agent
    from rollstream.envs.base import InvalidTask
    from rollstream.envs.harness import HarnessEnv

    if args.harness == "mini-swe-agent":
        spec = mini_swe_agent.harness(args.max_total_tokens, args.wall_clock_s)
    else:
        try:
            spec = json.loads(Path(args.harness).read_text())
        except (OSError, ValueError) as exc:
            print(f"error: --harness {args.harness}: {exc}", file=sys.stderr)
            return 2
        spec.setdefault("max_total_tokens", args.max_total_tokens)
        spec.setdefault("wall_clock_s", args.wall_clock_s)
    try:
        swe = load_tasks(args.instances, args.format)
        tasks = []
        for task in swe:
            task = validate_task({**mini_swe_agent.harness_task(task, spec),
                                  "max_turns": args.max_turns, "group_size": args.group_size})
            HarnessEnv().validate_task(task)
            tasks.append(task)
    except (TaskFileError, InvalidTask, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.output.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    if args.gold_scripts is not None:
        args.gold_scripts.write_text("".join(
            json.dumps(s) + "\n" for s in mini_swe_agent.gold_scripts(tasks)))
    print(f"wrote {len(tasks)} harness tasks to {args.output}")
    return 0


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "harness-tasks", help="turn SWE instances into tasks an agent harness plays",
        description="Write SWE instances as `harness` tasks (JSONL for `rollstream publish`): "
        "RUN starts the harness for each episode, pointed at its OpenAI-compatible gateway, "
        "and the workspace's diff is graded like a `swe` episode.")
    p.add_argument("instances", type=Path, help="SWE instance file (as for publish --format)")
    p.add_argument("-o", "--output", type=Path, required=True, help="tasks JSONL to write")
    p.add_argument("--format", default="swe-bench", help="format of INSTANCES")
    p.add_argument("--harness", default="mini-swe-agent",
                   help="`mini-swe-agent` (on RUN's PATH), or a JSON file holding the harness "
                        "object: command, config, env, max_total_tokens, wall_clock_s")
    p.add_argument("--max-turns", type=int, default=50, help="LLM calls per episode")
    p.add_argument("--group-size", type=int, default=1, help="episodes per task")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="token budget per episode (prompt + completion ids of all its calls)")
    p.add_argument("--wall-clock-s", type=float, default=1800.0,
                   help="the harness is stopped after this long")
    p.add_argument("--gold-scripts", type=Path, default=None, metavar="FILE.jsonl",
                   help="also write scripts for `serve-scripted --script` that answer "
                        "mini-swe-agent with each task's gold patch (tests, demos)")
    p.set_defaults(func=harness_tasks_command)
