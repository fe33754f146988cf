import pytest

from tests.helpers.scored_factory import scored
from trainer_bridge.groups import GroupAssembler, GroupPolicy, Sample


def add_group(assembler: GroupAssembler, task: str, rewards: list, versions=None,
              current: int = 0):
    released = None
    for i, r in enumerate(rewards):
        version = versions[i] if versions else 0
        sample = Sample(scored(task, i, r, group_size=len(rewards), version=version), 0, i)
        released = assembler.add(sample, current) or released
    return released


def test_group_is_released_only_when_complete_with_grpo_advantages() -> None:
    assembler = GroupAssembler()
    for i, r in enumerate([1.0, 0.0, 1.0]):
        assert assembler.add(Sample(scored("t", i, r, group_size=4), 0, i), 0) is None
    group = assembler.add(Sample(scored("t", 3, 0.0, group_size=4), 0, 3), 0)
    assert group is not None and len(group.samples) == 4
    assert [s.advantage for s in group.samples] == pytest.approx([1, -1, 1, -1], abs=1e-4)


def test_infra_failures_are_excluded_from_statistics_and_counted_under_partial() -> None:
    assembler = GroupAssembler(GroupPolicy(normalize_std=False, incomplete="partial"))
    group = add_group(assembler, "t", [1.0, None, 0.0, None])
    assert [s.advantage for s in group.samples] == [0.5, None, -0.5, None]
    assert [s.episode_id for s in group.trainable] == ["t#0", "t#2"]
    assert assembler.stats["infra_excluded"] == 2
    assert assembler.stats.get("groups_dropped_infra", 0) == 0


def test_a_group_with_an_infra_sample_is_dropped_whole_by_default() -> None:
    """An infra sample reaches the bridge only with its retries spent: under the default
    policy its group is dropped whole, never trained on shrunk. An env failure (deterministic,
    never retried) is left out of the statistics instead."""
    assembler = GroupAssembler()
    assert add_group(assembler, "t", [1.0, None, 0.0, 1.0]) is None
    assert assembler.stats["groups_dropped_infra"] == 1
    [dropped] = assembler.take_dropped()
    assert len(dropped.samples) == 4
    samples = [Sample(scored("e", i, r, failure_class=fc), 0, i) for i, (r, fc) in
               enumerate([(1.0, "ok"), (None, "env"), (0.0, "ok"), (1.0, "ok")])]
    group = [assembler.add(s, 0) for s in samples][-1]
    assert group is not None and [s.episode_id for s in group.trainable] == ["e#0", "e#2", "e#3"]
    assert (assembler.stats["env_excluded"], assembler.stats["groups_dropped_infra"]) == (1, 1)


def test_the_newest_attempt_of_an_episode_counts_and_late_older_ones_are_set_aside() -> None:
    assembler = GroupAssembler()

    def add(index: int, reward: float, attempt: int) -> object:
        sample = Sample(scored("t", index, reward, group_size=3, attempt=attempt), 0, 10 * index
                        + attempt)
        return assembler.add(sample, 0)

    assert add(0, 1.0, 0) is None
    assert add(1, 1.0, 0) is None
    assert add(1, 0.0, 2) is None  # a newer attempt replaces the older one
    assert add(1, 1.0, 1) is None  # a late older attempt never replaces a newer one
    assert add(1, 1.0, 2) is None  # nor does a repeat
    assert assembler.stats["older_attempts"] == 2 and assembler.stats["duplicate_samples"] == 1
    # Set aside to be acknowledged as handled: attempt 0 (replaced), 1 (late), 2's repeat.
    assert sorted(s.offset for s in assembler.take_set_aside()) == [10, 11, 12]
    group = add(2, 0.0, 1)
    assert group is not None
    assert [(s.episode_id, s.attempt, s.reward) for s in group.samples] == [
        ("t#0", 0, 1.0), ("t#1", 2, 0.0), ("t#2", 1, 0.0)]


def test_zero_variance_groups_are_dropped_and_counted() -> None:
    assembler = GroupAssembler()
    assert add_group(assembler, "t", [1.0, 1.0, 1.0, 1.0]) is None
    assert assembler.stats["groups_dropped_zero_variance"] == 1
    [dropped] = assembler.take_dropped()  # handed back so the bridge acknowledges its offsets
    assert len(dropped.samples) == 4
    keep = GroupAssembler(GroupPolicy(drop_zero_variance=False))
    assert add_group(keep, "t", [0.0, 0.0, 0.0, 0.0]) is not None


def test_stale_samples_are_dropped_and_counted() -> None:
    assembler = GroupAssembler(GroupPolicy(max_staleness=2))
    group = add_group(assembler, "t", [1.0, 0.0, 1.0, 0.0], versions=[7, 4, 6, 8], current=8)
    assert assembler.stats["stale_dropped"] == 1  # version 4 is 4 behind version 8
    assert group.samples[1].advantage is None
    assert [s.episode_id for s in group.trainable] == ["t#0", "t#2", "t#3"]


def test_incomplete_groups_time_out_and_are_dropped_or_trained() -> None:
    for rule, released_count, dropped_count in (("drop", 0, 1), ("partial", 1, 0)):
        assembler = GroupAssembler(GroupPolicy(group_timeout_s=5, incomplete=rule))
        for i, r in enumerate([1.0, 0.0]):
            assembler.add(Sample(scored("t", i, r, group_size=4), 0, i), 0)
        assert assembler.expire(0, now=0.0) == [] and assembler.take_dropped() == []
        released = assembler.expire(0, now=1e12)
        assert (len(released), len(assembler.take_dropped())) == (released_count, dropped_count)
        assert assembler.stats["groups_timed_out"] == 1 and not assembler.pending


def test_a_repeated_episode_is_not_counted_twice() -> None:
    assembler = GroupAssembler()
    sample = Sample(scored("t", 0, 1.0, group_size=2), 0, 0)
    assembler.add(sample, 0)
    assert assembler.add(Sample(scored("t", 0, 1.0, group_size=2), 1, 9), 0) is None
    assert assembler.stats["duplicate_samples"] == 1
