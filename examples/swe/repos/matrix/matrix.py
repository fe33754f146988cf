"""Small dense matrices as lists of rows."""


def transpose(rows: list[list[float]]) -> list[list[float]]:
    """Rows become columns."""
    n = len(rows)
    return [[rows[j][i] for j in range(n)] for i in range(n)]
