"""slime fed by Rollstream: slime's rollout function is the adapter's `generate_rollout`, which
returns the bridge's next batch of scored groups as slime's `Sample`s, grouped by prompt, and
commits the batch it returned before once slime asks again (slime has trained on it).

    python examples/trainers/slime_rollout.py

prints the job's settings and the flags of slime's `train.py` that plug it in; with slime
importable, it also calls the rollout function twice as slime does, on copy_letter groups
sampled and scored by the pipeline (started here, as processes), and prints what slime gets.
slime is not on the package registry: install it from its source. slime evaluates with the
rollout function unless `--eval-function-path` names another one (the adapter refuses eval
calls, naming it); slime syncs weights to its own rollout servers, so no PolicyVersion is
published to Rollstream (the adapter says so once).
"""

from __future__ import annotations

import importlib.util
import os
import sys

import common

FLAGS = ["--rollout-function-path", "trainer_bridge.adapters.slime_adapter.generate_rollout",
         "--eval-function-path", "slime.rollout.sglang_rollout.generate_rollout"]


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=2, help="groups per rollout (default 2)")
    args = p.parse_args(argv)
    settings = common.settings_for(args)
    env = {"KAFKA_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "ROLLSTREAM_PREFIX": settings.prefix, "ROLLSTREAM_SLIME_GROUPS": str(args.groups)}
    print("slime's train.py, with the environment", flush=True)
    print("  " + " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    print("  python train.py ... " + " ".join(FLAGS), flush=True)
    if importlib.util.find_spec("slime") is None:
        print("slime is not importable here (it is not on the package registry; install it "
              "from its source): only the flags above are shown", flush=True)
        return 0

    from producers.publish import publish, validate_task
    from rollstream.envs.copy_letter import demo_tasks
    from trainer_bridge.adapters import slime_adapter

    os.environ.update(env)
    with common.work_dir(args) as work, common.pipeline(settings, work / "logs"):
        publish(settings, [validate_task(t) for t in demo_tasks(8 * args.groups, 8)])
        try:
            for rollout_id in range(2):
                out = slime_adapter.generate_rollout(None, rollout_id, None)
                print(f"rollout {rollout_id}: {[len(row) for row in out.samples]} samples per "
                      f"prompt", flush=True)
        finally:
            slime_adapter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
