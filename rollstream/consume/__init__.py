"""The one consume → process → commit loop, in parts: the stage runtime (rollstream/runtime.py)
and the trainer bridge (trainer_bridge/bridge.py) both run on `loop.ConsumeLoop`.

- records.py: what a loop produces (Output) and the errors that dead-letter an input;
- deadletters.py: dead letters, the size check before producing, poison inputs;
- held.py: the partitions held, each one's progress, and which are paused (backpressure,
  restores);
- commit.py: when to commit, and the state of a commit that is out while the group is served;
- heap.py: the garbage collector of a process that serves stages;
- loop.py: the consumer's lifecycle in its group (assignment, revocation, loss, rebuilds),
  rewinds, and the commit.
"""
