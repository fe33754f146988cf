import pytest
from account import Account


def test_deposit_and_withdraw():
    acct = Account(10)
    acct.deposit(5)
    acct.withdraw(3)
    assert acct.balance == 12


def test_overdraw_rejected():
    with pytest.raises(ValueError):
        Account(1).withdraw(2)
