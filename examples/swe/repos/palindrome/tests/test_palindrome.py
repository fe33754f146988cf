from palindrome import is_palindrome


def test_simple():
    assert is_palindrome("level")


def test_not_a_palindrome():
    assert not is_palindrome("python")
