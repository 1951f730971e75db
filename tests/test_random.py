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


def test_get_and_set_rng_state_replay_the_draws_as_torchs():
    """``miniflow.get_rng_state`` / ``set_rng_state`` (PyTorch's names) were an AttributeError:
    the state taken before some draws (randn, init, dropout in a graph) replays them after
    ``set_rng_state``, as torch's does; a state of another kind is refused naming RngState."""
    mf.manual_seed(1)
    g, x = mf.compile(mf.nn.Dropout(0.5)), np.ones((4, 8), np.float32)   # a graph's dropout
    g(x)
    state = mf.get_rng_state()
    first = (mf.randn(3).numpy(), mf.nn.Linear(2, 2).weight.numpy(), g(x).numpy())
    assert not np.array_equal(g(x).numpy(), first[2])
    mf.set_rng_state(state)
    again = (mf.randn(3).numpy(), mf.nn.Linear(2, 2).weight.numpy(), g(x).numpy())
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="RngState.load_state_dict: expected a dict"):
        mf.set_rng_state(np.zeros(5, np.uint8))
    torch = pytest.importorskip("torch")
    state = torch.get_rng_state()
    a = torch.randn(3)
    torch.set_rng_state(state)
    assert torch.equal(torch.randn(3), a)
