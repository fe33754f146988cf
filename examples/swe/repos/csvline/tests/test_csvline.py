from csvline import split_fields


def test_plain_fields():
    assert split_fields("a,b,c") == ["a", "b", "c"]


def test_quotes_are_removed():
    assert split_fields('"a",b') == ["a", "b"]
