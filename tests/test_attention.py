"""Attention layers against PyTorch (skipped without it): ``nn.MultiheadAttention``,
``nn.LayerNorm``, ``nn.Embedding`` loaded with a PyTorch module's state dict give its outputs to
1e-5 in float32, masks included (the cases of PyTorch's ``test/test_nn.py`` MHA tests: bool and
float ``attn_mask``, ``key_padding_mask``, ``need_weights``, ``batch_first``), eager and in an
``nn.Graph``, with gradients after one SGD step; ``F.scaled_dot_product_attention`` with
``is_causal``; PyTorch's errors at construction or build, in miniflow's wording."""
import inspect
import math

import numpy as np
import pytest

import miniflow as mf
from miniflow.nn import functional as F

torch = pytest.importorskip("torch")
R = np.random.default_rng(0)


def _sd(module) -> dict:
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def _t(a):
    return torch.tensor(a)


class _Call(mf.nn.Graph):
    """``fn(module, *inputs)`` traced; with ``train``, ``sum(out * w)`` backward and one SGD step
    (lr 1)."""

    def __init__(self, module, fn, train=False):
        super().__init__()
        self.m, self.fn, self.train_ = module, fn, train
        if train:
            self.add_optimizer(mf.optim.SGD(module.parameters(), lr=1.0))

    def build(self, *xs):
        out = self.fn(self.m, *xs)
        if self.train_:
            w = mf.tensor(np.linspace(-1, 1, int(np.prod(out.shape)), dtype=np.float32)
                          .reshape(out.shape))
            (out * w).sum().backward()
        return out


def _torch_step(module, out):
    w = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * w).sum().backward()
    return {k: (p - p.grad).detach().numpy() for k, p in module.named_parameters()}


MASKS = {
    "none": lambda L, S, N, H: {},
    "bool": lambda L, S, N, H: {"attn_mask": np.triu(np.ones((L, S), bool), 1)},
    "float": lambda L, S, N, H: {"attn_mask": R.standard_normal((L, S)).astype(np.float32)},
    "3d": lambda L, S, N, H: {"attn_mask": R.random((N * H, L, S)) < 0.3},
    "padding": lambda L, S, N, H: {"key_padding_mask": np.array([[False] * (S - 1) + [True],
                                                                  [False] * S])},
}


def _torch_masks(kw):
    return {k: _t(v) for k, v in kw.items()}


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_matches_pytorch(mask, batch_first):
    n, length, src, e, h = 2, 5, 6, 8, 2
    ref = torch.nn.MultiheadAttention(e, h, batch_first=batch_first)
    mha = mf.nn.MultiheadAttention(e, h, batch_first=batch_first)
    mha.load_state_dict(_sd(ref))
    shape = (n, length, e) if batch_first else (length, n, e)
    kv_shape = (n, src, e) if batch_first else (src, n, e)
    q = R.standard_normal(shape).astype(np.float32)
    k, v = (R.standard_normal(kv_shape).astype(np.float32) for _ in range(2))
    kw = MASKS[mask](length, src, n, h)
    want, want_w = ref(_t(q), _t(k), _t(v), **_torch_masks(kw))
    got, got_w = mha(mf.tensor(q), mf.tensor(k), mf.tensor(v), **kw)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_w.numpy(), want_w.detach().numpy(), rtol=1e-5, atol=1e-6)
    graph = _Call(mha, lambda m, a, b, c: m(a, b, c, need_weights=False, **kw)[0], train=True)
    np.testing.assert_allclose(graph(mf.tensor(q), mf.tensor(k), mf.tensor(v)).numpy(),
                               want.detach().numpy(), rtol=1e-5, atol=1e-5)
    stepped = _torch_step(ref, ref(_t(q), _t(k), _t(v), need_weights=False,
                                   **_torch_masks(kw))[0])
    for name, p in mha.state_dict().items():
        np.testing.assert_allclose(p, stepped[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_multihead_attention_per_head_weights_and_causal_hint():
    ref = torch.nn.MultiheadAttention(12, 3, batch_first=True)
    mha = mf.nn.MultiheadAttention(12, 3, batch_first=True)
    mha.load_state_dict(_sd(ref))
    x = R.standard_normal((2, 4, 12)).astype(np.float32)
    causal = np.triu(np.ones((4, 4), bool), 1)
    want, want_w = ref(_t(x), _t(x), _t(x), attn_mask=_t(causal), is_causal=True,
                       average_attn_weights=False)
    got, got_w = mha(mf.tensor(x), mf.tensor(x), mf.tensor(x), attn_mask=causal, is_causal=True,
                     average_attn_weights=False)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_w.numpy(), want_w.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert sorted(mha.state_dict()) == sorted(ref.state_dict())


def test_multihead_attention_errors_are_pytorchs():
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads, got "
                                         "embed_dim=10 and num_heads=3"):
        mf.nn.MultiheadAttention(10, 3)
    mha = mf.nn.MultiheadAttention(8, 2, batch_first=True)
    x = mf.tensor(np.zeros((2, 4, 8), np.float32))
    with pytest.raises(ValueError, match=r"The shape of the 2D attn_mask is \[4, 5\], but "
                                         r"should be \[4, 4\]"):
        mha(x, x, x, attn_mask=np.zeros((4, 5), bool))
    with pytest.raises(TypeError, match="only bool and floating types of masks are supported"):
        mha(x, x, x, attn_mask=np.zeros((4, 4), np.complex64))
    with pytest.raises(ValueError, match="was expecting embedding dimension of 8, but got 6"):
        mha(mf.tensor(np.zeros((2, 4, 6), np.float32)), x, x)
    with pytest.raises(ValueError, match="Need attn_mask if specifying the is_causal hint"):
        mha(x, x, x, is_causal=True)


@pytest.mark.parametrize("case", ["causal", "bool", "float", "plain"])
def test_scaled_dot_product_attention_matches_pytorch(case):
    q = R.standard_normal((2, 3, 5, 4)).astype(np.float32)
    k = R.standard_normal((2, 3, 7, 4)).astype(np.float32)
    v = R.standard_normal((2, 3, 7, 6)).astype(np.float32)
    kw = {"causal": {"is_causal": True}, "plain": {"scale": 0.3},
          "bool": {"attn_mask": R.random((5, 7)) < 0.7},
          "float": {"attn_mask": R.standard_normal((3, 5, 7)).astype(np.float32)}}[case]
    tkw = {k_: (_t(v_) if isinstance(v_, np.ndarray) else v_) for k_, v_ in kw.items()}
    if case == "bool":
        kw["attn_mask"][:, 0] = True            # every row attends somewhere (no NaN rows)
        tkw["attn_mask"] = _t(kw["attn_mask"])
    want = torch.nn.functional.scaled_dot_product_attention(_t(q), _t(k), _t(v), **tkw)
    got = F.scaled_dot_product_attention(mf.tensor(q), mf.tensor(k), mf.tensor(v), **kw)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Explicit attn_mask should not be set when "
                                         "is_causal=True"):
        F.scaled_dot_product_attention(mf.tensor(q), mf.tensor(k), mf.tensor(v),
                                       attn_mask=np.ones((5, 7), bool), is_causal=True)


@pytest.mark.parametrize("kind", ["bool", "float", "eager tensor"])
def test_scaled_dot_product_attention_gives_0_for_a_query_that_may_attend_to_no_key(kind):
    """PyTorch (>= 2.5) gives 0 for a query row its mask takes every key from, with finite
    gradients; a plain softmax of ``-inf`` everywhere gave NaN here, and one training step made
    every weight NaN although the loss never read that row (a new user's finding). Against
    PyTorch, and the other rows against NumPy float64."""
    B, L, E = 2, 4, 8
    x = R.standard_normal((B, L, E)).astype(np.float32)
    w = (R.standard_normal((E, E)) * 0.3).astype(np.float32)
    keep = np.ones((B, L, L), bool) & np.tril(np.ones((L, L), bool))
    keep[0, :, 0] = False                       # sample 0's first key is padding: its row 0 is empty
    mask = {"bool": keep, "float": np.where(keep, 0.0, -np.inf).astype(np.float32),
            "eager tensor": mf.tensor(np.where(keep, 0.0, -np.inf).astype(np.float32))}[kind]

    def fn(m, x):
        q = x @ m.w
        return F.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    class W(mf.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = mf.nn.Parameter(w.copy())

    got = fn(W(), mf.tensor(x)).numpy()
    q = x.astype(np.float64) @ w
    s = np.where(keep, q @ q.transpose(0, 2, 1) / math.sqrt(E), -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.nan_to_num((p / p.sum(-1, keepdims=True)) @ q)
    assert (got[0, 0] == 0).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    tw = torch.tensor(w, requires_grad=True)
    tq = torch.tensor(x) @ tw
    tmask = torch.tensor(keep) if kind == "bool" else torch.tensor(np.where(
        keep, 0.0, -np.inf).astype(np.float32))
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tq, tq, attn_mask=tmask)
    np.testing.assert_allclose(got, ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    model = W()
    _Call(model, fn, train=True)(x)
    (ref * torch.tensor(np.linspace(-1, 1, ref.numel(), dtype=np.float32).reshape(ref.shape))
     ).sum().backward()
    assert np.isfinite(model.w.numpy()).all()
    np.testing.assert_allclose(model.w.numpy(), w - tw.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_a_python_bool_or_float_mask_is_refused_as_by_pytorch():
    """``masked_fill(True, v)`` filled everything and a float mask 0.5 filled nothing, and
    ``attn_mask=False`` masked every key (NaN): PyTorch refuses them (a mask is a bool tensor);
    so does miniflow, saying how to make one."""
    x = mf.tensor(np.ones((2, 2), np.float32))
    for bad in (True, False, 0, NotImplemented, None):
        with pytest.raises(TypeError, match="masked_fill: the mask must be a bool array or a "
                                            "Tensor, got"):
            x.masked_fill(bad, 0.0)
    with pytest.raises(TypeError, match="masked_fill: only supports boolean masks .* got an "
                                        "array of float64"):
        x.masked_fill(np.full((2, 2), 0.5), 0.0)
    with pytest.raises(RuntimeError, match="only supports boolean masks"):
        torch.ones(2, 2).masked_fill(torch.full((2, 2), 0.5), 0.0)
    q = mf.tensor(np.zeros((1, 3, 4), np.float32))
    with pytest.raises(TypeError, match="scaled_dot_product_attention: the mask must be a bool "
                                        "array or a Tensor, got bool False"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=False)
    np.testing.assert_array_equal(x.masked_fill([[True, False], [False, True]], 5.0).numpy(),
                                  [[5, 1], [1, 5]])


@pytest.mark.parametrize("shape,normalized", [((4, 6), 6), ((2, 3, 4), (3, 4))])
def test_layer_norm_matches_pytorch(shape, normalized):
    ref = torch.nn.LayerNorm(normalized)
    with torch.no_grad():
        ref.weight.copy_(torch.rand(ref.weight.shape) + 0.5)
        ref.bias.copy_(torch.randn(ref.bias.shape))
    ln = mf.nn.LayerNorm(normalized)
    ln.load_state_dict(_sd(ref))
    x = (R.standard_normal(shape) * 3 + 2).astype(np.float32)
    want = ref(_t(x))
    np.testing.assert_allclose(ln(mf.tensor(x)).numpy(), want.detach().numpy(), rtol=1e-5,
                               atol=1e-5)
    graph = _Call(ln, lambda m, a: m(a), train=True)
    np.testing.assert_allclose(graph(mf.tensor(x)).numpy(), want.detach().numpy(), rtol=1e-5,
                               atol=1e-5)
    stepped = _torch_step(ref, ref(_t(x)))
    for name, p in ln.state_dict().items():
        np.testing.assert_allclose(p, stepped[name], rtol=1e-5, atol=1e-5, err_msg=name)
    plain = torch.nn.LayerNorm(normalized, elementwise_affine=False)
    np.testing.assert_allclose(
        mf.nn.LayerNorm(normalized, elementwise_affine=False)(mf.tensor(x)).numpy(),
        plain(_t(x)).numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"Given normalized_shape=\[5\], expected input with "
                                         r"shape \[\*, 5\], but got input of size\[4, 6\]"):
        mf.nn.LayerNorm(5)(mf.tensor(np.zeros((4, 6), np.float32)))


def test_embedding_matches_pytorch_with_scatter_add_gradient():
    ref = torch.nn.Embedding(10, 4)
    emb = mf.nn.Embedding(10, 4)
    emb.load_state_dict(_sd(ref))
    ids = np.array([[1, 3, 3, 9], [0, 1, 1, 1]], np.int64)          # repeats accumulate
    want = ref(_t(ids))
    np.testing.assert_allclose(emb(ids).numpy(), want.detach().numpy(), rtol=0, atol=0)
    graph = _Call(emb, lambda m, a: m(a), train=True)
    np.testing.assert_allclose(graph(mf.tensor(ids)).numpy(), want.detach().numpy())
    stepped = _torch_step(ref, ref(_t(ids)))
    np.testing.assert_allclose(emb.weight.numpy(), stepped["weight"], rtol=1e-6, atol=1e-6)


def test_embedding_ids_out_of_range_are_named():
    emb = mf.nn.Embedding(10, 4)
    with pytest.raises(IndexError, match=r"embedding: index 12 at input\[1, 1\] is out of range "
                                         r"\[0, 10\) \(num_embeddings=10; 2 of 6 ids"):
        emb(np.array([[0, 1, 2], [3, 12, 10]]))
    graph = _Call(emb, lambda m, a: m(a))
    with pytest.raises(IndexError, match=r"gather: index -1 at indices\[0, 1\] is out of range "
                                         r"\[0, 10\) of axis 0 of \[10,4\]"):
        graph(mf.tensor(np.array([[2, -1]], np.int64)))


def test_scaled_dot_product_attention_refuses_a_mask_of_the_wrong_shape_or_dtype():
    """PyTorch refuses a mask that does not broadcast to ``[*, L, S]`` (a size mismatch at the
    add) and a mask that is neither bool nor float ("only bool and floating types of masks are
    supported"); miniflow at build time, naming the shapes and the shape to give. Before, a
    wrong shape failed inside ``masked_fill``'s inference, naming an op the user never called."""
    q, k = (mf.tensor(np.zeros(s, np.float32)) for s in ((2, 3, 5, 4), (2, 3, 7, 4)))
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: attn_mask of shape "
                                         r"\[7, 5\] does not broadcast to the attention scores "
                                         r"\[\*, L, S\] = \[2, 3, 5, 7\]; give it the shape "
                                         r"\[L, S\] = \[5, 7\]"):
        F.scaled_dot_product_attention(q, k, k, attn_mask=np.ones((7, 5), bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \[4, 5, 7\] does not broadcast"):
        F.scaled_dot_product_attention(q, k, k, attn_mask=np.zeros((4, 5, 7), np.float32))
    with pytest.raises(TypeError, match="only bool and floating types of masks are supported, "
                                        "got an array of complex64"):
        F.scaled_dot_product_attention(q, k, k, attn_mask=np.ones((5, 7), np.complex64))
    for bad in (np.ones((7, 5), bool), np.ones((5, 7), np.int32)):
        with pytest.raises(RuntimeError):
            torch.nn.functional.scaled_dot_product_attention(
                *(torch.zeros(s) for s in ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4))),
                attn_mask=torch.tensor(bad))


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("per_head", [True, False])
def test_multihead_attention_takes_unbatched_inputs_as_pytorch(batch_first, per_head):
    """PyTorch's ``MultiheadAttention`` doc: ``query (L, E)`` "for unbatched input", with
    ``key_padding_mask (S)`` and ``attn_mask (L, S)`` or ``(num_heads, L, S)``, gives
    ``(L, E)`` and weights ``(L, S)`` (``(num_heads, L, S)`` per head); before, miniflow
    refused a 2-D query."""
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first)
    mha = mf.nn.MultiheadAttention(8, 2, batch_first=batch_first)
    mha.load_state_dict(_sd(ref))
    q, k = (R.standard_normal(s).astype(np.float32) for s in ((5, 8), (6, 8)))
    kw = {"key_padding_mask": np.array([False] * 5 + [True]),
          "attn_mask": R.random((2, 5, 6)) < 0.3 if per_head else np.triu(np.ones((5, 6), bool),
                                                                         2)}
    want, want_w = ref(_t(q), _t(k), _t(k), average_attn_weights=not per_head,
                       **_torch_masks(kw))
    got, got_w = mha(mf.tensor(q), mf.tensor(k), mf.tensor(k), average_attn_weights=not per_head,
                     **kw)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_w.numpy(), want_w.detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="For unbatched \\(2-D\\) query, expected key and value "
                                         "to be 2-D, but found 3-D and 2-D"):
        mha(mf.tensor(q), mf.tensor(k[None]), mf.tensor(k))


@pytest.mark.parametrize("shape", [(5, 8), (2, 5, 8)])
def test_multihead_attention_names_an_input_that_is_no_tensor(shape):
    """A NumPy query, key or value is refused naming it and what to do, batched or not (PyTorch
    refuses them too); an unbatched one raised AttributeError ('numpy.ndarray' object has no
    attribute 'unsqueeze') from inside forward."""
    mha = mf.nn.MultiheadAttention(8, 2)
    x = R.standard_normal(shape).astype(np.float32)
    for i, name in enumerate(("query", "key", "value")):
        args = [mf.tensor(x)] * 3
        args[i] = x
        with pytest.raises(TypeError, match=f"MultiheadAttention: {name} is a ndarray, not a "
                                            r"miniflow Tensor; wrap data with miniflow.tensor"):
            mha(*args)
    with pytest.raises((TypeError, AttributeError)):
        torch.nn.MultiheadAttention(8, 2)(x, x, x)


def test_multihead_attention_names_an_input_dtype_other_than_its_parameters():
    """An input of another dtype than the parameters is refused at build time naming the
    module, the argument, its dtype and shape, and both ways out; it was matmul's "inputs have
    different dtypes: %6 (f32[6,8]), %4 (f16[8,8])" about the reshaped projection."""
    class Attend(mf.nn.Graph):
        def __init__(self, mha):
            super().__init__()
            self.mha = mha

        def build(self, q, k):
            return self.mha(q, k, k)[0]
    x = np.ones((2, 3, 8), np.float32)
    half = Attend(mf.nn.MultiheadAttention(8, 2, dtype=mf.float16))
    with pytest.raises(TypeError, match=r"MultiheadAttention: query float32\[2, 3, 8\] is not "
                                        r"of the module's parameter dtype float16; cast it with "
                                        r"\.to\(miniflow\.float16\), or make the "
                                        r"MultiheadAttention with dtype=miniflow\.float32"):
        half(x, x.astype(np.float16))
    mha = mf.nn.MultiheadAttention(8, 2)
    with pytest.raises(TypeError, match=r"key float64\[2, 3, 8\] is not of the module's "
                                        r"parameter dtype float32"):
        Attend(mha)(x, x.astype(np.float64))
    with pytest.raises(TypeError, match=r"query int64\[3, 8\] is not of the module's parameter "
                                        r"dtype float32; cast it with \.to\(miniflow\.float32\)$"):
        mha(*(mf.tensor(np.ones((3, 8), np.int64)),) * 3)
    assert half(x.astype(np.float16), x.astype(np.float16)).dtype == mf.float16


def test_multihead_attention_refuses_3d_and_padding_masks_of_the_wrong_shape():
    """Issue 25's "an ``attn_mask`` of the wrong shape": PyTorch's messages for the 3-D mask
    (``[N * num_heads, L, S]``) and ``key_padding_mask`` (``[N, S]``), at build time."""
    mha = mf.nn.MultiheadAttention(8, 2, batch_first=True)
    x = mf.tensor(np.zeros((2, 4, 8), np.float32))
    with pytest.raises(ValueError, match=r"The shape of the 3D attn_mask is \[2, 4, 4\], but "
                                         r"should be \[4, 4, 4\]"):
        mha(x, x, x, attn_mask=np.zeros((2, 4, 4), bool))
    with pytest.raises(ValueError, match=r"expected key_padding_mask of shape \[2, 4\] "
                                         r"\(\[N, S\]\), got \[2, 3\]"):
        mha(x, x, x, key_padding_mask=np.zeros((2, 3), bool))
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    for kw in ({"attn_mask": _t(np.zeros((2, 4, 4), bool))},
               {"key_padding_mask": _t(np.zeros((2, 3), bool))}):
        with pytest.raises((RuntimeError, AssertionError)):     # torch asserts the padding
            ref(*(torch.zeros(2, 4, 8),) * 3, **kw)


@pytest.mark.parametrize("masks", ["padding", "attn_mask", "both", "float padding"])
def test_multihead_attention_without_weights_gives_a_query_with_no_key_0_as_pytorch(masks):
    """``need_weights=False`` (what ``nn.TransformerEncoderLayer`` passes) takes PyTorch's
    ``scaled_dot_product_attention`` path: a query that may attend to no key (a sample whose
    keys are all padding, a row of ``attn_mask`` all set) has attention 0, so its output is
    ``out_proj.bias``, with finite gradients. miniflow gave NaN there (a plain softmax, what
    PyTorch gives with ``need_weights=True`` only), and one training step made every weight
    NaN. Eager and in a graph, with one SGD step, against PyTorch."""
    n, length, src, e, h = 2, 4, 5, 8, 2
    ref = torch.nn.MultiheadAttention(e, h, batch_first=True)
    torch.nn.init.normal_(ref.out_proj.bias)
    mha = mf.nn.MultiheadAttention(e, h, batch_first=True)
    mha.load_state_dict(_sd(ref))
    pad = np.zeros((n, src), bool)
    pad[0] = True                                   # sample 0: every key is padding
    pad[1, -1] = True
    am = np.triu(np.ones((length, src), bool), 2)
    am[1] = True                                    # query 1 of every sample: no key
    kw = {"padding": {"key_padding_mask": pad}, "attn_mask": {"attn_mask": am},
          "both": {"key_padding_mask": pad, "attn_mask": am},
          "float padding": {"key_padding_mask": np.where(pad, -np.inf, 0).astype(np.float32),
                            "attn_mask": np.where(am, -np.inf, 0.5).astype(np.float32)}}[masks]
    q, k = (R.standard_normal((n, s, e)).astype(np.float32) for s in (length, src))
    want = ref(_t(q), _t(k), _t(k), need_weights=False, **_torch_masks(kw))[0]
    got = mha(mf.tensor(q), mf.tensor(k), mf.tensor(k), need_weights=False, **kw)[0].numpy()
    assert np.isfinite(want.detach().numpy()).all()
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-5)
    graph = _Call(mha, lambda m, a, b: m(a, b, b, need_weights=False, **kw)[0], train=True)
    np.testing.assert_allclose(graph(q, k).numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    stepped = _torch_step(ref, want)
    for name, p in mha.state_dict().items():
        np.testing.assert_allclose(p, stepped[name], rtol=1e-5, atol=1e-5, err_msg=name)
    with_weights = mha(mf.tensor(q), mf.tensor(k), mf.tensor(k), **kw)[1].numpy()
    assert np.isnan(with_weights).any()             # PyTorch's softmax path: NaN rows
    assert np.isnan(ref(_t(q), _t(k), _t(k), **_torch_masks(kw))[1].detach().numpy()).any()


BROADCASTS = {"shared key and value": ((2, 3, 5, 4), (1, 3, 7, 4), (1, 3, 7, 4)),
              "one query batch": ((1, 3, 5, 4), (2, 3, 7, 4), (2, 1, 7, 4)),
              "2-D query": ((5, 4), (2, 7, 4), (2, 7, 4))}


@pytest.mark.parametrize("case", list(BROADCASTS))
def test_scaled_dot_product_attention_broadcasts_leading_dimensions_as_pytorch(case):
    """query, key and value whose leading dimensions differ but broadcast (a key and value of
    batch 1 for every query, a 2-D query): PyTorch broadcasts them, miniflow refused them. The
    output and, in a graph with one SGD step, every input's gradient (summed over the batch it
    was broadcast along) match PyTorch's; leading dimensions that do not broadcast are named."""
    shapes = BROADCASTS[case]
    arrays = [R.standard_normal(s).astype(np.float32) for s in shapes]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=True)
    model = mf.nn.Module()
    model.q, model.k, model.v = (mf.nn.Parameter(a) for a in arrays)
    graph = _Call(model, lambda m: F.scaled_dot_product_attention(m.q, m.k, m.v, is_causal=True),
                  train=True)
    np.testing.assert_allclose(graph().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    (want * torch.linspace(-1, 1, want.numel()).reshape(want.shape)).sum().backward()
    for name, a, t in zip("qkv", arrays, ts):
        np.testing.assert_allclose(getattr(model, name).numpy(), a - t.grad.numpy(), rtol=1e-5,
                                   atol=1e-5, err_msg=name)
    with pytest.raises(ValueError, match=r"leading dimensions that broadcast together, got "
                                         r"\[2, 5, 4\], \[3, 7, 4\], \[3, 7, 4\]"):
        F.scaled_dot_product_attention(*(mf.tensor(np.zeros(s, np.float32))
                                         for s in ((2, 5, 4), (3, 7, 4), (3, 7, 4))))


@pytest.mark.parametrize("case", ["4-D", "3-D", "value heads", "causal mask", "one head"])
def test_scaled_dot_product_attention_takes_enable_gqa_as_pytorch(case):
    """PyTorch's ``enable_gqa`` (grouped-query attention): query heads ``Hq``, key and value
    heads dividing it, query head ``i`` attending with key/value head ``i // (Hq / Hk)``
    (``repeat_interleave``). ``enable_gqa=False``, what code written for PyTorch passes, was a
    TypeError (no such keyword), and so was ``True``. Eager and in a graph with one SGD step,
    against PyTorch; unequal heads without it, or heads that do not divide, are refused."""
    hq, hk, hv = {"4-D": (6, 3, 3), "3-D": (4, 2, 2), "value heads": (6, 2, 3),
                  "causal mask": (4, 2, 2), "one head": (4, 1, 1)}[case]
    lead = () if case == "3-D" else (2,)
    q = R.standard_normal(lead + (hq, 5, 4)).astype(np.float32)
    k = R.standard_normal(lead + (hk, 7, 4)).astype(np.float32)
    v = R.standard_normal(lead + (hv, 7, 3)).astype(np.float32)
    kw = {"attn_mask": R.standard_normal((hq, 5, 7)).astype(np.float32)}
    if case == "causal mask":
        kw = {"is_causal": True, "scale": 0.7}
    tkw = {a: (_t(b) if isinstance(b, np.ndarray) else b) for a, b in kw.items()}
    tq = torch.tensor(q, requires_grad=True)
    want = torch.nn.functional.scaled_dot_product_attention(tq, _t(k), _t(v), enable_gqa=True,
                                                            **tkw)
    got = F.scaled_dot_product_attention(mf.tensor(q), mf.tensor(k), mf.tensor(v),
                                         enable_gqa=True, **kw)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)

    class Q(mf.nn.Module):
        def __init__(self):
            super().__init__()
            self.q = mf.nn.Parameter(q.copy())

    model = Q()
    graph = _Call(model, lambda m, a, b: F.scaled_dot_product_attention(
        m.q * 1.0, a, b, enable_gqa=True, **kw), train=True)
    np.testing.assert_allclose(graph(k, v).numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)
    (want * torch.linspace(-1, 1, want.numel()).reshape(want.shape)).sum().backward()
    np.testing.assert_allclose(model.q.numpy(), q - tq.grad.numpy(), rtol=1e-5, atol=1e-6)
    same = F.scaled_dot_product_attention(mf.tensor(q), mf.tensor(q), mf.tensor(q),
                                          enable_gqa=False)
    np.testing.assert_allclose(same.numpy(), torch.nn.functional.scaled_dot_product_attention(
        _t(q), _t(q), _t(q)).numpy(), rtol=1e-5, atol=1e-6)
    if hk > 1:
        with pytest.raises(ValueError, match=r"scaled_dot_product_attention: .* broadcast "
                                             r"together.*pass enable_gqa=True"):
            F.scaled_dot_product_attention(mf.tensor(q), mf.tensor(k), mf.tensor(v))
    bad = mf.tensor(R.standard_normal(lead + (hq - 1, 7, 4)).astype(np.float32))
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: enable_gqa: the "
                                         rf"number of heads of key \({hq - 1}\) and value "
                                         rf"\({hq - 1}\) must divide the number of heads of "
                                         rf"query \({hq}\)"):
        F.scaled_dot_product_attention(mf.tensor(q), bad, bad, enable_gqa=True)
    with pytest.raises(RuntimeError, match="Number of heads in key and value must divide"):
        torch.nn.functional.scaled_dot_product_attention(_t(q), torch.zeros(bad.shape),
                                                         torch.zeros(bad.shape),
                                                         enable_gqa=True)
    with pytest.raises(ValueError, match=r"enable_gqa needs query, key and value of rank >= 3 "
                                         r"\(\[\*, H, L, E\]\), got \[5, 4\]"):
        x = mf.tensor(q.reshape(-1, 4)[:5])
        F.scaled_dot_product_attention(x, x, x, enable_gqa=True)


@pytest.mark.parametrize("kdim,vdim", [(4, 6), (8, 5), (8, 8)])
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_takes_kdim_and_vdim_as_pytorch(kdim, vdim, batch_first):
    """PyTorch's ``kdim`` / ``vdim`` (key and value feature sizes other than ``embed_dim``):
    separate ``q_proj_weight [E, E]``, ``k_proj_weight [E, kdim]``, ``v_proj_weight [E, vdim]``
    in place of ``in_proj_weight`` (PyTorch's state-dict keys), ``in_proj_bias [3E]``; equal to
    ``embed_dim`` they change nothing. They were a TypeError (no such keyword), and so were
    ``add_bias_kv=False`` and ``add_zero_attn=False``, PyTorch's defaults. A torch state dict
    loads; outputs, weights, and one SGD step in a graph match PyTorch's."""
    e, h, n, length, src = 8, 2, 2, 5, 6
    ref = torch.nn.MultiheadAttention(e, h, kdim=kdim, vdim=vdim, batch_first=batch_first)
    mha = mf.nn.MultiheadAttention(e, h, add_bias_kv=False, add_zero_attn=False, kdim=kdim,
                                   vdim=vdim, batch_first=batch_first)
    assert sorted(mha.state_dict()) == sorted(ref.state_dict())
    assert {k: v.shape for k, v in mha.state_dict().items()} == {
        k: tuple(v.shape) for k, v in ref.state_dict().items()}
    mha.load_state_dict(_sd(ref))
    order = (lambda a, b, c: (a, b, c)) if batch_first else (lambda a, b, c: (b, a, c))
    q = R.standard_normal(order(n, length, e)).astype(np.float32)
    k = R.standard_normal(order(n, src, kdim)).astype(np.float32)
    v = R.standard_normal(order(n, src, vdim)).astype(np.float32)
    kw = {"key_padding_mask": np.array([[False] * (src - 1) + [True], [False] * src])}
    want, want_w = ref(_t(q), _t(k), _t(v), **_torch_masks(kw))
    got, got_w = mha(mf.tensor(q), mf.tensor(k), mf.tensor(v), **kw)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_w.numpy(), want_w.detach().numpy(), rtol=1e-5, atol=1e-6)
    graph = _Call(mha, lambda m, a, b, c: m(a, b, c, **kw)[0], train=True)
    np.testing.assert_allclose(graph(q, k, v).numpy(), want.detach().numpy(), rtol=1e-5,
                               atol=1e-5)
    stepped = _torch_step(ref, want)
    for name, p in mha.state_dict().items():
        np.testing.assert_allclose(p, stepped[name], rtol=1e-5, atol=1e-5, err_msg=name)
    unbatched = mha(mf.tensor(q[0] if batch_first else q[:, 0]),
                    mf.tensor(k[0] if batch_first else k[:, 0]),
                    mf.tensor(v[0] if batch_first else v[:, 0]))[0]
    assert unbatched.shape == (length, e)
    if (kdim, vdim) != (e, e):
        with pytest.raises(ValueError, match=rf"MultiheadAttention: was expecting key "
                                             rf"embedding dimension of {kdim}, but got {kdim + 1}"):
            mha(mf.tensor(q), mf.tensor(np.zeros(order(n, src, kdim + 1), np.float32)),
                mf.tensor(v))


def test_multihead_attention_refuses_add_bias_kv_and_add_zero_attn_by_name():
    """PyTorch's ``add_bias_kv`` and ``add_zero_attn`` are not there: True is refused at
    construction naming it and the way out (was: an unexpected keyword argument)."""
    for name in ("add_bias_kv", "add_zero_attn"):
        with pytest.raises(ValueError, match=rf"MultiheadAttention: {name}=True is not "
                                             rf"supported \(only PyTorch's default "
                                             rf"{name}=False\)"):
            mf.nn.MultiheadAttention(8, 2, **{name: True})
    for bad in ({"kdim": 0}, {"vdim": 2.5}):
        with pytest.raises(ValueError, match="MultiheadAttention: .dim must be a positive"):
            mf.nn.MultiheadAttention(8, 2, **bad)


def test_multihead_attention_takes_pytorchs_positional_order():
    """``MultiheadAttention(8, 2, 0.0, True, True)`` gave batch_first=True; PyTorch's fifth
    argument is add_bias_kv (refused at True, saying to give batch_first by keyword), and
    kdim, vdim and batch_first come next, as PyTorch's."""
    with pytest.raises(ValueError, match=r"add_bias_kv=True is not supported .*give those by "
                                         r"keyword"):
        mf.nn.MultiheadAttention(8, 2, 0.0, True, True)
    mha = mf.nn.MultiheadAttention(8, 2, 0.0, False, False, False, 4, 6, True)
    assert (mha.batch_first, mha.kdim, mha.vdim, mha.in_proj_bias) == (True, 4, 6, None)
    assert tuple(mha.k_proj_weight.shape) == (8, 4)
    torch = pytest.importorskip("torch")
    names = list(inspect.signature(torch.nn.MultiheadAttention).parameters)
    assert list(inspect.signature(mf.nn.MultiheadAttention).parameters) == names


def test_a_numpy_integer_mask_is_taken_as_the_int64_tensor_mask():
    """``attn_mask=np.triu(np.ones((5, 5), np.int64), 1)`` was refused ("only bool and floating
    types of masks are supported, got an array of int64") while the same mask as ``mf.tensor``
    worked, and the bool-dtype error says to give masks as int64: an integer array is that
    mask (nonzero True), in MultiheadAttention and scaled_dot_product_attention, equal to the
    bool array's result."""
    x = np.random.default_rng(3).standard_normal((5, 1, 8)).astype(np.float32)
    mask = np.triu(np.ones((5, 5), np.int64), 1)
    mf.manual_seed(0)
    mha = mf.nn.MultiheadAttention(8, 2)
    want = [t.numpy() for t in mha(mf.tensor(x), mf.tensor(x), mf.tensor(x),
                                   attn_mask=mask.astype(bool))]
    for m in (mask, mask.astype(np.int32), mask.astype(np.uint8), mf.tensor(mask)):
        got = mha(mf.tensor(x), mf.tensor(x), mf.tensor(x), attn_mask=m)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w)
    q = mf.tensor(x.transpose(1, 0, 2))
    sdpa = mf.nn.functional.scaled_dot_product_attention
    want = sdpa(q, q, q, attn_mask=mask == 0).numpy()
    for m in ((mask == 0).astype(np.int64), (mask == 0).astype(np.int16)):
        np.testing.assert_array_equal(sdpa(q, q, q, attn_mask=m).numpy(), want)
    with pytest.raises(TypeError, match="only bool and floating types of masks are supported, "
                                        "got an array of complex64"):
        sdpa(q, q, q, attn_mask=mask.astype(np.complex64))


def test_a_bool_key_padding_mask_as_a_graph_input_is_refused_saying_int64_not_float():
    """A tutorial's encoder passes its bool ``key_padding_mask`` into the training step. miniflow
    has no bool tensors; the error said "convert your array with .astype first", and
    ``mask.astype(float32)`` is a float mask PyTorch adds to the scores (0 and 1: nothing is
    masked, silently). It says int64, which gives PyTorch's result; a bool tensor as the input
    (bool tensors are eager, no graph value is bool) is refused the same way."""
    mha = mf.nn.MultiheadAttention(4, 2, batch_first=True)
    ref = torch.nn.MultiheadAttention(4, 2, batch_first=True)
    ref.load_state_dict({k: torch.tensor(v) for k, v in mha.state_dict().items()})
    x = np.random.default_rng(3).random((2, 3, 4), dtype=np.float32)
    pad = np.array([[False, False, True], [False, True, True]])

    class Attend(mf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def build(self, x, pad):
            return self.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0]

    for mask in (pad, mf.tensor(pad)):
        with pytest.raises(TypeError, match=r"graph input 1: bool tensors are eager.*"
                                            r"mask.astype\(np.int64\).*mask.float\(\) would "
                                            r"mask nothing"):
            Attend()(x, mask)
    want = ref(_t(x), _t(x), _t(x), key_padding_mask=torch.tensor(pad), need_weights=False)[0]
    got = Attend()(x, pad.astype(np.int64)).numpy()
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-6)
