from rle import decode, encode


def test_encode():
    assert encode("aaab") == "3a1b"


def test_round_trip_short_runs():
    assert decode(encode("aabccc")) == "aabccc"
