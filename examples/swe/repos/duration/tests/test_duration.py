import pytest
from duration import parse_seconds


def test_single_unit():
    assert parse_seconds("45s") == 45


def test_rejects_garbage():
    with pytest.raises(ValueError):
        parse_seconds("soon")
