"""`rollstream serve-policy`: the embedded policy behind a vLLM-compatible HTTP API."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollstream.cli import common


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve-policy",
        help="serve the embedded tiny policy over vLLM's OpenAI-compatible API",
        description="Serve the embedded policy (seed weights unless --checkpoint) on "
        "/v1/completions, /tokenize, /detokenize, /health, /v1/models, /metrics and "
        "/v1/load_weights. Nothing is downloaded.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011, help="0 picks a free port")
    p.add_argument(
        "--checkpoint", default=None, help="safetensors checkpoint (default: seed weights)"
    )
    p.add_argument("--model-name", default="rollstream-tiny", help="name served in /v1/models")
    p.add_argument("--max-batch", type=int, default=64, help="sequences decoded together")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights and sampling")
    p.add_argument(
        "--save-base", metavar="PATH", default=None,
        help="write the demo's version 0 for copy_letter tasks to PATH and exit: the seed "
        "weights with their output restricted to the task's letters, so a group's rewards "
        "differ from the start (give it to serve-policy --checkpoint and train "
        "--init-checkpoint; the seed weights alone rarely answer with a letter)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    if args.save_base is not None:
        from rollstream.dev.loop import write_base_policy

        path = Path(args.save_base)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_base_policy(path, seed=args.seed)
        print(path)
        return 0
    from rollstream.policy_server.app import serve  # torch import only when serving

    def ready(url: str) -> None:
        print(f"serving {args.model_name} on {url}", flush=True)

    return common.run_async(serve(args.host, args.port, ready=ready, model_path=args.checkpoint,
                                  model_name=args.model_name, max_batch=args.max_batch,
                                  seed=args.seed))
