from romans import from_roman


def test_additive():
    assert from_roman("XVI") == 16


def test_lowercase():
    assert from_roman("xii") == 12
