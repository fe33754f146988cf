"""`rollstream serve-scripted`: the scripted policy (rollstream.dev.scripted) over vLLM's API, for
tests and demos."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollstream.cli import common
from rollstream.dev.scripted import create_app, read_scripts, swe_scripts


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve-scripted",
        help="serve scripted completions over vLLM's API (tests, demos)",
        description="A policy server that answers from scripts: the script whose match text "
        "occurs in an episode's first message gives its turn-by-turn completions. Same HTTP "
        "contract as serve-policy.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011, help="0 picks a free port")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--script", type=Path, metavar="FILE.jsonl",
                        help='scripts, one {"match": text, "completions": [text, ...]} per line')
    source.add_argument("--swe-gold", type=Path, metavar="INSTANCES",
                        help="SWE tasks: replay each task's gold patch as tool calls, submit")
    source.add_argument("--swe-submit-only", type=Path, metavar="INSTANCES",
                        help="SWE tasks: submit at once, changing nothing")
    p.add_argument("--format", default="swe-bench",
                   help="format of the INSTANCES file (as for `rollstream publish`)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from rollstream.policy_server.app import serve

    if args.script is not None:
        scripts = read_scripts(args.script)
    else:
        scripts = swe_scripts(args.swe_gold or args.swe_submit_only, args.format,
                              gold=args.swe_gold is not None)

    def ready(url: str) -> None:
        print(f"serving {len(scripts)} scripts on {url}", flush=True)

    return common.run_async(serve(args.host, args.port, ready=ready, app=create_app(scripts)))
