from wordfreq import top_words


def test_counts():
    assert top_words("a b a", 1) == [("a", 2)]
