from wordwrap import wrap


def test_breaks_between_words():
    assert wrap("aaa bbb ccc ddd", 7)[0] == "aaa bbb"


def test_empty_text():
    assert wrap("", 10) == []
