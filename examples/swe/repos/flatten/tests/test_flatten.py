from flatten import flatten


def test_nested_numbers():
    assert flatten([1, [2, [3, (4,)]]]) == [1, 2, 3, 4]
