import pytest
from stack import EmptyStackError, Stack


def test_lifo():
    s = Stack()
    s.push(1)
    s.push(2)
    assert s.pop() == 2 and s.peek() == 1


def test_peek_empty():
    with pytest.raises(EmptyStackError):
        Stack().peek()
