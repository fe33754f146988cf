"""Moving averages."""


def moving_average(values: list[float], window: int) -> list[float]:
    """The mean of each full window of consecutive values."""
    return [sum(values[i:i + window]) / window for i in range(len(values) - window)]
