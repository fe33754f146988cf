from iniconf import parse


def test_pairs_and_comments():
    assert parse("# comment\na = 1\n\nb=two") == {"a": "1", "b": "two"}
