from deepmerge import merge


def test_flat_override():
    assert merge({"a": 1, "b": 2}, {"b": 3}) == {"a": 1, "b": 3}


def test_inputs_unchanged():
    base = {"a": 1}
    merge(base, {"a": 2})
    assert base == {"a": 1}
