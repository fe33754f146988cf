from slugify import slugify


def test_simple():
    assert slugify("hello") == "hello"


def test_lowercases():
    assert slugify("ABC") == "abc"
