from movingavg import moving_average


def test_first_window():
    assert moving_average([1, 2, 3, 4], 2)[0] == 1.5
