from snakecase import to_snake


def test_simple():
    assert to_snake("CamelCase") == "camel_case"


def test_already_lower():
    assert to_snake("plain") == "plain"
