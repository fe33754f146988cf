"""Learning from an earlier run: run 1 samples and scores copy_letter tasks (INIT, RUN with the
embedded policy server, EVAL); its scored groups whose mean reward is at least --min-reward are
replayed into run 2, which trains the reference GRPO trainer on them, mixed with run 2's fresh
batches (none here: run 2 samples nothing), and commits each step's PolicyVersion.

    python examples/trainers/offpolicy_replay.py --min-reward 0.1

Starts what it needs: the bundled Kafka broker (or uses --bootstrap-servers), two jobs' topics
(run 1's prefix, fresh or --prefix, and `<it>-run2`), and run 1's pipeline as processes.
Replaying again copies nothing twice (shown); the training ends once neither side has had a
batch for --idle-timeout seconds.
"""

from __future__ import annotations

import sys
import time
from argparse import Namespace

import common


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=24, help="run 1's tasks (default 24)")
    p.add_argument("--group-size", type=int, default=8, help="samples per task (default 8)")
    p.add_argument("--groups-per-batch", type=int, default=1,
                   help="groups in each training batch (default 1)")
    p.add_argument("--min-reward", type=float, default=0.1,
                   help="replay groups whose mean reward is at least this (default 0.1)")
    p.add_argument("--replay-share", type=float, default=0.25,
                   help="the share of replayed batches while fresh ones come (default 0.25)")
    p.add_argument("--idle-timeout", type=float, default=10.0,
                   help="stop once neither side had a batch for this long, s (default 10)")
    args = p.parse_args(argv)

    from producers.publish import publish, validate_task
    from rollstream.contracts.events import POLICY_VERSION
    from rollstream.envs.copy_letter import demo_tasks
    from rollstream.runtime import Output
    from trainer_bridge.bridge import TrainerBridge
    from trainer_bridge.offpolicy import mixed, replay_scored, replay_settings
    from trainer_bridge.trainer import GRPOTrainer, TinyPolicy

    run1 = common.settings_for(args)
    run2 = common.settings_for(Namespace(bootstrap_servers=run1.bootstrap_servers,
                                         prefix=f"{run1.prefix}-run2"))
    expected = args.tasks * args.group_size
    with common.work_dir(args) as work:
        with common.pipeline(run1, work / "logs"):
            publish(run1, [validate_task(t) for t in demo_tasks(args.tasks, args.group_size)])
            deadline = time.monotonic() + 300
            while (scored := common.scored_count(run1)) < expected:
                if time.monotonic() > deadline:
                    sys.exit(f"run 1 scored {scored} of {expected} episodes in 300 s")
                time.sleep(1)
        print(f"run 1 ({run1.prefix}) scored {expected} episodes", flush=True)

        copied = replay_scored(run1, run2, min_reward=args.min_reward)
        again = replay_scored(run1, run2, min_reward=args.min_reward)
        print(f"replayed {copied} samples (whole groups) into {replay_settings(run2).prefix}; "
              f"replaying again copied {again}", flush=True)

        trainer = GRPOTrainer(TinyPolicy(seed=0), work / "checkpoints", version=0)
        with TrainerBridge(replay_settings(run2), args.groups_per_batch) as old, \
                TrainerBridge(run2, args.groups_per_batch) as fresh:
            for batch in mixed(fresh, old, replay_share=args.replay_share,
                               idle_timeout_s=args.idle_timeout):
                event = trainer.step(batch)
                # The step's PolicyVersion, committed with the batch's offsets.
                batch.ack([Output(run2.topics.policy, "policy", POLICY_VERSION, event)])
                print(f"version {event['version']}: {len(batch.groups)} groups, mean reward "
                      f"{event['metrics']['mean_reward']:.3f}", flush=True)
        print(f"run 2 ({run2.prefix}) committed versions {common.committed_versions(run2)}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
