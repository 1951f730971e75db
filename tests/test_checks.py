"""``miniflow.checks``: what each argument check accepts, returns and raises (its message)."""
import math
from fractions import Fraction

import numpy as np
import pytest

from miniflow import checks


def test_predicates_refuse_bools_and_take_numpy_numbers():
    assert checks.is_real(1) and checks.is_real(np.float32(0.5)) and checks.is_real(Fraction(1, 3))
    assert checks.is_real(math.nan) and checks.is_real(math.inf)
    assert checks.is_integer(3) and checks.is_integer(np.int64(-2))
    for bad in (True, np.bool_(True), "1", None):
        assert not checks.is_real(bad) and not checks.is_integer(bad)
    assert not checks.is_integer(1.0)


def test_real_number_returns_the_value_unchanged():
    for v in (2, np.float32(0.1), math.nan, -math.inf):
        assert checks.real_number("elu", "alpha", v) is v
    with pytest.raises(TypeError, match=r"^elu: alpha must be a real number, got True$"):
        checks.real_number("elu", "alpha", True)
    with pytest.raises(TypeError, match=r"^scale must be a real number, got '2'$"):
        checks.real_number("", "scale", "2")


def test_real_is_a_finite_float_in_its_range():
    assert checks.real("SGD", "lr", 1) == 1.0 and type(checks.real("SGD", "lr", 1)) is float
    assert checks.real("X", "b", 0.0, 0.0, 1.0) == 0.0
    cases = [((math.nan,), "[-inf, inf)"), ((math.inf, 0.0), "[0, inf)"),
             ((-1, 0.0), "[0, inf)"), ((1.5, 0.0, 1.0), "[0, 1]"),
             ((0.0, 0.0, 1.0, True), "(0, 1]"), ((1.0, 0.0, 1.0, False, True), "[0, 1)")]
    for args, bounds in cases:
        value, *rest = args
        range_ = dict(zip(("low", "high", "low_open", "high_open"), rest))
        with pytest.raises(ValueError) as e:
            checks.real("X", "b", value, **range_)
        assert str(e.value) == f"X: b must be finite and in {bounds}, got {value!r}"
    with pytest.raises(TypeError, match="X: b must be a real number, got None"):
        checks.real("X", "b", None)


def test_integers_and_bools():
    assert checks.integer("S", "n", np.int64(3), 0) == 3
    assert checks.positive_integer("Linear", "in_features", 4) == 4
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match=rf"^S: n must be an integer >= 0, got {bad!r}$"):
            checks.integer("S", "n", bad, 0)
    for bad in (0, False, "3"):
        with pytest.raises(ValueError, match=r"^Linear: in_features must be a positive integer"):
            checks.positive_integer("Linear", "in_features", bad)
    assert checks.boolean("train", "mode", False) is False
    assert checks.boolean("", "found_inf", np.bool_(True), numpy=True) is True
    for bad, numpy in ((np.bool_(True), False), (1, True), (None, False)):
        with pytest.raises(TypeError, match=r"^train: mode must be True or False, got "):
            checks.boolean("train", "mode", bad, numpy=numpy)
