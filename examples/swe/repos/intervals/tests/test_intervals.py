from intervals import merge


def test_overlapping():
    assert merge([(1, 4), (2, 6)]) == [(1, 6)]


def test_disjoint_are_sorted():
    assert merge([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]
