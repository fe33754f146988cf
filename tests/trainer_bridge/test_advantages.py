import pytest

from trainer_bridge.advantages import group_advantages


def test_grpo_normalizes_by_group_mean_and_std() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-4)


def test_dr_grpo_keeps_the_reward_scale() -> None:
    assert group_advantages([1.0, 0.0, 0.5], normalize_std=False) == pytest.approx([0.5, -0.5, 0])


def test_infra_failures_take_no_part_in_the_baseline() -> None:
    # Counted as 0 the baseline would be 0.25 and the successes' advantage smaller.
    adv = group_advantages([1.0, None, 0.0, None], normalize_std=False)
    assert adv == [0.5, None, -0.5, None]


def test_fewer_than_two_rewards_give_no_advantage() -> None:
    assert group_advantages([None, 1.0, None]) == [None, None, None]
