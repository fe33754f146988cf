from temperature import c_to_f, f_to_c


def test_c_to_f():
    assert c_to_f(100) == 212


def test_freezing_point():
    assert f_to_c(32) == 0
