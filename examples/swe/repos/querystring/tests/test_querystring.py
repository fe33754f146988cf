from querystring import build_query


def test_plain():
    assert build_query({"a": "1", "b": "2"}) == "a=1&b=2"
