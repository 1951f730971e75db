"""``dropout``: the mask's statistics and determinism, its gradient, ``nn.Dropout`` /
``F.dropout`` against PyTorch's semantics (``torch.nn.Dropout``'s doc: zeros with probability
``p``, the rest scaled by ``1 / (1 - p)``, identity in eval mode), and the random stream's place in
``miniflow.manual_seed`` and ``RngState`` (a resumed run draws the same masks)."""
import numpy as np
import pytest

import miniflow as mf
from miniflow.nn.dropout import dropout_state
from miniflow.ops.dropout import dropout_mask
from miniflow.random import RngState


def test_mask_keeps_one_minus_p_of_the_elements_and_scales_them():
    mf.manual_seed(0)
    x = np.ones((200, 500), np.float32)
    y = mf.nn.functional.dropout(mf.tensor(x), p=0.3).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.005            # 100000 draws: 4.5 sigma is 0.0065
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
    # independent of position: both halves keep the same share
    assert abs(kept[:, :250].mean() - kept[:, 250:].mean()) < 0.01


def test_the_kernel_draws_the_reference_bits_and_advances_the_stream():
    mf.manual_seed(7)
    assert list(dropout_state().numpy()) == [7, 0]
    x = np.arange(1, 61, dtype=np.float32).reshape(6, 10)
    y = mf.nn.functional.dropout(mf.tensor(x), p=0.5).numpy()
    np.testing.assert_array_equal(y != 0, dropout_mask(7, 0, 60, 0.5).reshape(6, 10) != 0)
    assert list(dropout_state().numpy()) == [7, 60]
    y2 = mf.nn.functional.dropout(mf.tensor(x), p=0.5).numpy()
    assert not np.array_equal(y != 0, y2 != 0)       # a new mask at every call


def test_eval_mode_and_p_zero_are_the_identity_and_bad_p_is_refused():
    d = mf.nn.Dropout(0.4)
    x = mf.tensor(np.ones((3, 4), np.float32))
    d.eval()
    assert d(x) is x
    assert mf.nn.functional.dropout(x, 0.0) is x
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1, but "
                                         "got 1.5"):
        mf.nn.Dropout(1.5)
    assert "rng_state" not in d.state_dict()          # PyTorch's state dicts load unchanged


class _Net(mf.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = mf.nn.Linear(8, 8)
        self.drop = mf.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))


class _Step(mf.nn.Graph):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.add_optimizer(mf.optim.SGD(net.parameters(), lr=0.1))

    def build(self, x):
        y = self.net(x)
        loss = (y * y).sum()
        loss.backward()
        return y


def test_gradient_is_dy_times_mask_over_one_minus_p():
    mf.manual_seed(3)
    net = _Net()
    w0 = net.fc.weight.numpy().copy()
    b0 = net.fc.bias.numpy().copy()
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    state = dropout_state().numpy().copy()
    y = _Step(net)(mf.tensor(x)).numpy()
    mask = dropout_mask(int(state[0]), int(state[1]), 32, 0.5).reshape(4, 8)
    h = x.astype(np.float64) @ w0.T + b0
    np.testing.assert_allclose(y, h * mask * 2, rtol=1e-5, atol=1e-6)
    dh = 2 * y.astype(np.float64) * mask * 2              # d(sum y^2)/dh = 2y * mask / (1 - p)
    np.testing.assert_allclose(net.fc.bias.numpy(), b0 - 0.1 * dh.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(net.fc.weight.numpy(), w0 - 0.1 * dh.T @ x, rtol=1e-5, atol=1e-6)


def test_resumed_stream_draws_the_same_masks():
    mf.manual_seed(11)
    net = _Net()
    step = _Step(net)
    x = mf.tensor(np.ones((4, 8), np.float32))
    step(x)
    saved = RngState().state_dict()
    assert saved["streams"]["dropout"] == [11, 32]
    want = [step(x).numpy() != 0 for _ in range(2)]
    RngState().load_state_dict(saved)
    got = [step(x).numpy() != 0 for _ in range(2)]
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    old = {k: v for k, v in saved.items() if k != "streams"}   # a checkpoint without streams
    RngState().load_state_dict(old)
    assert RngState().state_dict()["streams"]["dropout"] == [11, 96]


class _Functional(mf.nn.Module):
    """Dropout as PyTorch code often calls it: ``F.dropout(x, self.p, self.training)``, with
    no ``nn.Dropout`` in the model."""

    def __init__(self):
        super().__init__()
        self.fc = mf.nn.Linear(8, 8)
        self.p = 0.5

    def forward(self, x):
        return mf.nn.functional.dropout(self.fc(x), self.p, self.training)


def test_functional_dropout_in_a_graph_without_a_dropout_module_draws_from_the_stream():
    """Before, ``F.dropout`` (and ``scaled_dot_product_attention(dropout_p=)``) in a graph whose
    modules had no ``nn.Dropout`` raised a RuntimeError asking for one, where PyTorch just
    drops; now the stream is the graph variable ``dropout.rng_state``: the masks are the
    reference's, the stream advances, ``eval()`` is the identity and a restored stream draws
    the same masks again."""
    mf.manual_seed(5)
    net = _Functional()
    step = _Step(net)
    x = np.ones((4, 8), np.float32)
    state = dropout_state().numpy().copy()
    y = step(mf.tensor(x)).numpy()
    assert "dropout.rng_state" in step.ir.variables
    mask = dropout_mask(int(state[0]), int(state[1]), 32, 0.5).reshape(4, 8)
    np.testing.assert_array_equal(y != 0, mask != 0)
    assert list(dropout_state().numpy()) == [5, 32]
    saved = RngState().state_dict()
    want = step(mf.tensor(x)).numpy() != 0
    RngState().load_state_dict(saved)
    np.testing.assert_array_equal(step(mf.tensor(x)).numpy() != 0, want)

    class Attend(mf.nn.Graph):
        def build(self, q):
            return mf.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)

    before = dropout_state().numpy()[1]
    out = Attend()(mf.tensor(np.ones((2, 3, 4), np.float32))).numpy()
    assert dropout_state().numpy()[1] == before + 18 and 0 < (out == 0).mean() < 1
    net.eval()

    class Forward(mf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net

        def build(self, x):
            return self.net(x)

    np.testing.assert_array_equal(Forward()(mf.tensor(x)).numpy(), net.fc(mf.tensor(x)).numpy())


def test_seeds_from_2_to_the_63_seed_their_own_stream():
    """A new user's finding: the stream took the seed's low 63 bits, so ``manual_seed(2**63)``
    drew seed 0's masks and ``2**200`` too (the global generator told them apart)."""
    seeds = []
    for seed in (0, 5, 2 ** 63 - 1, 2 ** 63, 2 ** 63 + 5, 2 ** 200):
        mf.manual_seed(seed)
        seeds.append(int(dropout_state().numpy()[0]))
    assert seeds[:3] == [0, 5, 2 ** 63 - 1]                  # below 2^63: the seed itself
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2 ** 63 for s in seeds)
