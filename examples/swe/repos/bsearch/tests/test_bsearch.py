from bsearch import index_of


def test_found_in_middle():
    assert index_of([1, 3, 5, 7, 9], 5) == 2


def test_missing():
    assert index_of([1, 3, 5], 4) == -1
