"""``miniflow.models.gpt`` against nanoGPT's structure in PyTorch (``benchmarks/torch_gpt.py``;
skipped without torch): a PyTorch model's state dict loads (the tied ``lm_head.weight``
included) and gives its logits and loss to 1e-5 in float32, and SGD training steps give its
parameters; the errors of a bad sequence (too long, ids out of range) name what is wrong;
nanoGPT's attention code, spelled as in PyTorch, runs on miniflow tensors."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow.models import gpt

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from torch_gpt import TorchGPT  # noqa: E402

CFG = dict(vocab_size=23, block_size=12, n_layer=2, n_head=2, n_embd=16)
R = np.random.default_rng(0)
IDX = R.integers(0, 23, (3, 10)).astype(np.int64)
TGT = R.integers(0, 23, (3, 10)).astype(np.int64)


def _pair():
    torch.manual_seed(0)
    ref = TorchGPT(**CFG)
    model = gpt(**CFG)
    model.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    return ref, model


class _Train(mf.nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.5))

    def build(self, idx, tgt):
        _, loss = self.model(idx, tgt)
        loss.backward()
        return loss


class _Logits(mf.nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, idx):
        return self.model(idx)


def test_state_dict_has_nanogpts_keys_and_the_logits_match():
    ref, model = _pair()
    assert list(model.state_dict()) == list(ref.state_dict())
    want = ref(torch.tensor(IDX)).detach().numpy()
    np.testing.assert_allclose(model(IDX).numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_Logits(model)(mf.tensor(IDX)).numpy(), want, rtol=1e-5,
                               atol=1e-5)
    assert model.transformer.wte.weight is model.lm_head.weight


def test_a_bfloat16_or_requires_grad_torch_state_dict_loads():
    """The tied-weight check read the state dict with ``np.asarray``: a bfloat16 torch state
    dict (``ref.to(torch.bfloat16).state_dict()``) was torch's "unsupported ScalarType
    BFloat16" and parameters that require grad (``dict(ref.named_parameters())``) its "Can't
    call numpy() on Tensor that requires grad", where Module's loader reads both."""
    ref, model = _pair()
    live = dict(ref.named_parameters()) | {"lm_head.weight": ref.lm_head.weight}
    model.load_state_dict(live)
    np.testing.assert_array_equal(model.lm_head.weight.numpy(), ref.lm_head.weight.detach())
    half = {k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()}
    model.load_state_dict(half)
    np.testing.assert_array_equal(model.transformer.wte.weight.numpy(),
                                  half["transformer.wte.weight"].float().numpy())


def test_training_steps_match_pytorch():
    """SGD, not Adam: the key bias's exact gradient is zero (softmax ignores a shift shared by a
    row's scores), so both frameworks' gradients there are rounding noise, which Adam would
    normalise into full-size, uncorrelated steps."""
    ref, model = _pair()
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    step = _Train(model)
    for k in range(3):
        opt.zero_grad()
        _, loss = ref(torch.tensor(IDX), torch.tensor(TGT))
        loss.backward()
        opt.step()
        got = float(step(mf.tensor(IDX), mf.tensor(TGT)))
        assert got == pytest.approx(loss.item(), rel=1e-5)
    for name, value in ref.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[name], value.numpy(), rtol=1e-4,
                                   atol=1e-5, err_msg=name)


def test_bad_sequences_and_state_dicts_are_refused_clearly():
    _, model = _pair()
    with pytest.raises(ValueError, match="Cannot forward sequence of length 13, block size is "
                                         "only 12"):
        model(np.zeros((1, 13), np.int64))
    with pytest.raises(IndexError, match=r"gpt: index 23 at idx\[0, 2\] is out of range "
                                         r"\[0, 23\) \(vocab_size=23"):
        model(np.array([[1, 2, 23]]))
    bad = dict(model.state_dict())
    bad["lm_head.weight"] = bad["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="lm_head.weight and transformer.wte.weight differ"):
        model.load_state_dict(bad)
    with pytest.raises(ValueError, match="n_embd must be divisible by n_head"):
        gpt(10, n_embd=10, n_head=3)


def _nano_attention(F, x, w_attn, b_attn, w_proj, b_proj, n_head, mask):
    """nanoGPT's ``CausalSelfAttention.forward`` (its explicit path), spelled as in PyTorch; the
    framework's ``functional`` as ``F``, ``mask`` True above the diagonal (a bool tensor for
    PyTorch, its int64 stand-in for miniflow)."""
    B, T, C = x.size()
    q, k, v = F.linear(x, w_attn, b_attn).split(C, dim=2)
    k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
    q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
    v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(mask[:, :, :T, :T], float("-inf"))
    att = F.softmax(att, dim=-1)
    y = att @ v
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return F.linear(y, w_proj, b_proj)


class _BufferMaskedAttention(mf.nn.Module):
    """nanoGPT's non-flash attention weights: a ``block`` x ``block`` ``tril`` buffer, sliced to
    the ``T`` tokens of ``q`` in ``forward``."""

    def __init__(self, block: int, T: int):
        super().__init__()
        self.T = T
        self.register_buffer("bias", mf.tensor(np.tril(np.ones((block, block), np.float32))
                                               .reshape(1, 1, block, block)))

    def forward(self, q):
        T = self.T
        att = (q @ q.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        return att.softmax(dim=-1)


def _torch_buffer_masked_attention(q, block: int, T: int) -> np.ndarray:
    """:class:`_BufferMaskedAttention`'s weights in PyTorch."""
    tq = torch.tensor(q)
    att = (tq @ tq.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return att.masked_fill(torch.tril(torch.ones(block, block)).view(1, 1, block, block)
                           [:, :, :T, :T] == 0, float("-inf")).softmax(-1).numpy()


def test_nanogpt_causal_mask_from_a_registered_buffer_masks_in_a_graph():
    """nanoGPT's non-flash path: ``att.masked_fill(self.bias[:, :, :T, :T] == 0, -inf)`` with
    ``bias`` a registered ``tril`` buffer. The buffer is eager while ``build`` traces, and its
    ``== 0`` was Python identity (False): the mask masked nothing, silently. An eager tensor
    compared with a number now gives its NumPy bool array, as PyTorch's bool tensor."""
    T = 4
    q = R.standard_normal((1, 1, T, 8)).astype(np.float32)
    want = _torch_buffer_masked_attention(q, T, T)
    for got in (_BufferMaskedAttention(T, T)(mf.tensor(q)),
                _Logits(_BufferMaskedAttention(T, T))(q)):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
        assert (np.triu(got.numpy()[0, 0], 1) == 0).all()


def test_nanogpt_causal_mask_sliced_shorter_than_the_buffer_masks_in_a_graph():
    """nanoGPT's buffer is ``block_size`` long and ``forward`` slices it to the sequence,
    ``self.bias[:, :, :T, :T] == 0`` with ``T < block_size`` (generation, short batches). The
    slice is a lazy node inside ``build``, so the comparison raised "lazy tensor ... has no value
    at trace time"; a slice, reshape or transpose of a buffer or constant is now read at trace
    time, as the unsliced buffer is. A parameter's slice still has no trace-time value."""
    block, T = 8, 5
    q = R.standard_normal((2, 3, T, 8)).astype(np.float32)
    np.testing.assert_allclose(_Logits(_BufferMaskedAttention(block, T))(q).numpy(),
                               _torch_buffer_masked_attention(q, block, T), rtol=1e-6, atol=1e-7)

    class ParamCompare(mf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = mf.nn.Linear(4, 4)

        def build(self, x):
            return x.masked_fill(self.lin.weight[:2] == 0, 0.0)
    with pytest.raises(RuntimeError, match="has no value at trace time"):
        ParamCompare()(np.ones((2, 4), np.float32))


def test_nanogpt_attention_code_runs_on_miniflow_tensors():
    x = R.standard_normal((2, 5, 8)).astype(np.float32)
    ws = [R.standard_normal(s).astype(np.float32) * 0.3 for s in ((24, 8), (24,), (8, 8), (8,))]
    mask = np.triu(np.ones((1, 1, 6, 6), bool), 1)
    want = _nano_attention(torch.nn.functional, torch.tensor(x),
                           *(torch.tensor(w) for w in ws), 2, torch.tensor(mask))
    got = _nano_attention(mf.nn.functional, mf.tensor(x), *(mf.tensor(w) for w in ws), 2,
                          mf.tensor(mask.astype(np.int64)))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_ids_and_targets_are_checked_where_the_user_passes_them():
    """nanoGPT's ``forward(idx, targets)`` takes ``targets`` of ``idx``'s shape; a mismatch
    failed inside a ``reshape`` ("cannot reshape %in0 (i64[3,7])"), a list of ids raised
    ``AttributeError: 'list' object has no attribute 'ndim'``, and float ids were truncated
    to int64 without a word. Now: lists are ids, floats are refused, the shapes and the
    target values are checked naming ``gpt`` and the argument (PyTorch's ``cross_entropy``
    raises for a target out of range, "Target 23 is out of bounds")."""
    _, model = _pair()
    np.testing.assert_array_equal(model(IDX.tolist()).numpy(), model(IDX).numpy())
    with pytest.raises(ValueError, match=r"gpt: targets must have idx's shape \[3, 10\] "
                                         r"\(\[batch, time\]: the next token of each\), got "
                                         r"\[3, 9\]"):
        model(IDX, TGT[:, :-1])
    with pytest.raises(TypeError, match="gpt: idx ids must be integers, got an array of "
                                        "float64"):
        model(IDX + 0.5)
    bad = TGT.copy()
    bad[2, 4] = 23
    with pytest.raises(IndexError, match=r"gpt: index 23 at targets\[2, 4\] is out of range "
                                         r"\[0, 23\) \(vocab_size=23; 1 of 30 ids"):
        model(IDX, bad)
    with pytest.raises(ValueError, match=r"gpt: targets must have idx's shape"):
        _Train(model)(mf.tensor(IDX), mf.tensor(TGT[:, :-1]))


def test_a_sequence_longer_than_the_position_table_is_refused_at_build_time():
    """Issue 25's acceptance: nanoGPT's assertion ("Cannot forward sequence of length 13, block
    size is only 12") when the graph is built, before anything runs."""
    _, model = _pair()
    with pytest.raises(ValueError, match="gpt: Cannot forward sequence of length 13, block size "
                                         "is only 12"):
        _Train(model)(mf.tensor(np.zeros((1, 13), np.int64)), mf.tensor(np.zeros((1, 13),
                                                                                  np.int64)))
