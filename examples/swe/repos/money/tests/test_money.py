from money import format_cents


def test_thousands():
    assert format_cents(123456) == "$1,234.56"


def test_small():
    assert format_cents(5) == "$0.05"
