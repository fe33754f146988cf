from datetime import date

from daterange import days_between


def test_starts_at_start():
    assert days_between(date(2024, 1, 1), date(2024, 1, 3))[0] == date(2024, 1, 1)
