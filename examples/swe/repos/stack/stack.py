"""A stack with a clear error when empty."""


class EmptyStackError(Exception):
    """Raised by pop and peek on an empty stack."""


class Stack:
    def __init__(self) -> None:
        self._items: list = []

    def push(self, item: object) -> None:
        self._items.append(item)

    def pop(self) -> object:
        return self._items.pop()

    def peek(self) -> object:
        if not self._items:
            raise EmptyStackError("peek from an empty stack")
        return self._items[-1]
