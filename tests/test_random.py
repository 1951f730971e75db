"""``miniflow.manual_seed``: reproducible draws; a seed that NumPy's ``default_rng`` cannot take is
a clear error naming it."""
import numpy as np
import pytest

import miniflow as mf
from miniflow.random import generator


@pytest.mark.parametrize("seed", [0, 7, np.int64(7), np.uint32(7), 2**70])
def test_manual_seed_is_reproducible(seed):
    g = mf.manual_seed(seed)
    assert generator() is g
    a = g.random(3)
    assert np.array_equal(mf.manual_seed(seed).random(3), a)
    assert np.array_equal(a, np.random.default_rng(int(seed)).random(3))


@pytest.mark.parametrize("seed,error,match", [
    ("abc", TypeError, r"manual_seed: the seed must be an integer >= 0, got 'abc' \(str\)"),
    (1.5, TypeError, r"manual_seed: the seed must be an integer >= 0, got 1\.5 \(float\)"),
    (2.0, TypeError, r"got 2\.0 \(float\)"),
    (True, TypeError, r"got True \(bool\)"),
    (None, TypeError, r"got None \(NoneType\)"),
    (-1, ValueError, r"manual_seed: the seed must be an integer >= 0 \(NumPy's default_rng takes "
                     r"no negative seeds\), got -1"),
    (np.int64(-3), ValueError, r"got -3"),
])
def test_manual_seed_rejects_what_numpy_cannot_take(seed, error, match):
    before = generator()
    with pytest.raises(error, match=match):
        mf.manual_seed(seed)
    assert generator() is before
