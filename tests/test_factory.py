"""PyTorch's factory keywords ``device=`` / ``dtype=`` on the layers that create parameters
(``miniflow.nn.factory``; PyTorch's module docs, e.g. ``torch.nn.Linear(in_features,
out_features, bias=True, device=None, dtype=None)``, and ``test_nn.py``'s factory-kwargs
tests): the parameters and floating buffers take the dtype, the device must be the process's
backend, anything else is refused naming the layer and what it accepts. A float64 layer
trains as PyTorch's float64 one (skipped without torch)."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn

LAYERS = {
    "Linear": lambda **kw: nn.Linear(4, 3, **kw),
    "Conv2d": lambda **kw: nn.Conv2d(2, 3, 3, **kw),
    "BatchNorm1d": lambda **kw: nn.BatchNorm1d(3, **kw),
    "BatchNorm2d": lambda **kw: nn.BatchNorm2d(3, affine=False, **kw),
    "LayerNorm": lambda **kw: nn.LayerNorm(5, **kw),
    "RMSNorm": lambda **kw: nn.RMSNorm(5, **kw),
    "Embedding": lambda **kw: nn.Embedding(7, 4, **kw),
    "MultiheadAttention": lambda **kw: nn.MultiheadAttention(4, 2, **kw),
}


def _floating(module) -> dict:
    return {k: np.asarray(v).dtype for k, v in module.state_dict().items()
            if np.asarray(v).dtype.kind == "f"}


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("dtype,want", [(None, np.float32), ("float64", np.float64),
                                        (mf.float64, np.float64), (np.float16, np.float16),
                                        ("torch.float64", np.float64)])
def test_a_layer_creates_its_state_in_the_dtype_on_the_process_device(name, dtype, want):
    layer = LAYERS[name](device="cpu", dtype=dtype)
    dtypes = _floating(layer)
    assert dtypes and set(dtypes.values()) == {np.dtype(want)}, dtypes
    assert list(layer.state_dict()) == list(LAYERS[name]().state_dict())


@pytest.mark.parametrize("name", list(LAYERS))
def test_another_device_or_a_non_float_dtype_is_refused_naming_the_layer(name):
    with pytest.raises(ValueError, match=rf"{name}: device='cuda' is not this process's device"
                                         r".*miniflow.set_backend.*pass device=None or 'cpu'"):
        LAYERS[name](device="cuda")
    with pytest.raises(ValueError, match=rf"{name}: device='cpu:1'"):
        LAYERS[name](device="cpu:1")
    with pytest.raises(TypeError, match=rf"{name}: dtype='int64': parameters must be floating "
                                        r"point, float32 \(the default\), float64"):
        LAYERS[name](dtype="int64")
    with pytest.raises(TypeError, match=rf"{name}: dtype='complex64' is not a dtype miniflow "
                                        r"has"):
        LAYERS[name](dtype="complex64")


def test_a_torch_device_and_dtype_are_accepted():
    torch = pytest.importorskip("torch")
    layer = nn.Linear(4, 3, device=torch.device("cpu"), dtype=torch.float64)
    assert layer.weight.numpy().dtype == np.float64


def test_a_float64_layer_trains_as_torchs_float64_layer():
    """One SGD step of ``Linear(..., dtype=float64)`` on float64 data gives PyTorch's float64
    parameters (to 1e-12: same arithmetic, another summation order)."""
    torch = pytest.importorskip("torch")
    ref = torch.nn.Linear(4, 3, dtype=torch.float64)
    layer = nn.Linear(4, 3, dtype=torch.float64)
    layer.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    x = np.random.default_rng(2).standard_normal((5, 4))
    (ref(torch.tensor(x)) ** 2).sum().backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad

    class Step(nn.Graph):
        def __init__(self):
            super().__init__()
            self.layer = layer
            self.add_optimizer(mf.optim.SGD(layer.parameters(), lr=0.1))

        def build(self, a):
            y = self.layer(a)
            loss = (y * y).sum()
            loss.backward()
            return loss

    Step()(mf.tensor(x))
    for name, value in ref.state_dict().items():
        got = layer.state_dict()[name]
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, value.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)


def test_tensor_and_module_to_take_the_process_device_as_pytorch_scripts_pass_it():
    """``x.to(device)``, ``x.to(device, dtype)``, ``x.to(other)``, ``model.to(device)`` and
    ``x.cpu()``, in nearly every PyTorch script: the process's device changes nothing (this
    tensor or module is returned, as PyTorch returns it when nothing changes), another one is
    refused naming the backend. Before, ``Tensor.to("cpu")`` said "unsupported dtype 'cpu'" and
    ``Module.to`` and ``Tensor.cpu`` were missing. A module is not converted to another dtype:
    refused naming a parameter."""
    torch = pytest.importorskip("torch")
    here = mf.runtime.backend.get_backend().name
    t = mf.tensor(np.ones((2, 3), np.float32))
    assert t.to(here) is t and t.to(torch.device(here)) is t and t.to(device=here) is t
    assert t.to(torch.float32) is t and t.to(t) is t
    assert t.to(torch.float32, copy=True) is not t
    half = t.to(here, torch.float16, non_blocking=True)
    assert half.dtype is mf.float16 and t.to(half).dtype is mf.float16
    assert t.to(dtype=torch.float64).dtype is mf.float64
    with pytest.raises(ValueError, match="Tensor.to: device='mps' is not this process's device"):
        t.to("mps")
    with pytest.raises(TypeError, match="Tensor.to: the device is given twice"):
        t.to(here, device=here)
    with pytest.raises(TypeError, match="unsupported dtype 'flaot32'"):
        t.to("flaot32")
    assert t.detach().cpu() is not None and t.cpu() is t            # x.cpu().numpy()
    np.testing.assert_array_equal(t.cpu().numpy(), np.ones((2, 3), np.float32))
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    assert model.to(here) is model and model.to(torch.device(here), torch.float32) is model
    with pytest.raises(ValueError, match="Sequential.to: device='cuda:1'"):
        model.to("cuda:1")
    with pytest.raises(TypeError, match=r"Sequential.to\(float16\): '0.weight' is float32, and "
                                        r"miniflow does not convert a module"):
        model.to(torch.float16)


FACTORY_CALLS = [
    ("zeros", (2, 3), {}), ("zeros", ((2, 3),), {}), ("ones", ([4],), {}), ("ones", (3,), {}),
    ("zeros", (2,), {"dtype": "float64"}), ("ones", (2, 2), {"dtype": "int64"}),
    ("full", ((2, 3), 7), {}), ("full", ((2,), 0.5), {}), ("full", ([3], 2), {"dtype": "float16"}),
    ("arange", (5,), {}), ("arange", (0, 7, 2), {}), ("arange", (1.0, 2.0, 0.25), {}),
    ("arange", (0, 4), {"dtype": "int64"}), ("arange", (6, 0, -2), {}), ("arange", (3, 3), {}),
    ("zeros", (0, 2), {}),
]


@pytest.mark.parametrize("fn,args,kwargs", FACTORY_CALLS)
def test_factories_give_pytorchs_values_dtypes_and_shapes(fn, args, kwargs):
    """``miniflow.zeros / ones / full / arange`` (nanoGPT's ``torch.ones(T, T)`` and
    ``torch.arange(0, t, dtype=torch.long, device=device)``) as PyTorch's: the size as ints or a
    sequence, float32 by default, ``full`` and ``arange`` infer int64 from integers."""
    torch = pytest.importorskip("torch")
    ours = getattr(mf, fn)(*args, **{**kwargs, "device": "cpu"})
    theirs = getattr(torch, fn)(*args, **{k: getattr(torch, v) for k, v in kwargs.items()})
    assert ours.dtype.name == str(theirs.dtype).replace("torch.", "")
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_a_0d_size_makes_a_0d_tensor():
    """``torch.zeros(())`` is 0-d; miniflow's factories made shape (1,) (NumPy's
    ``ascontiguousarray`` makes a 0-d array 1-d), so ``loss + zeros_like(loss)`` was [1]."""
    scalar = mf.tensor(np.float32(2.0))
    made = [mf.zeros(()), mf.ones(()), mf.full((), 2.0), mf.rand(()), mf.randn(()),
            mf.randint(0, 5, ()), mf.zeros_like(scalar), mf.ones_like(scalar), mf.zeros([])]
    assert [t.shape for t in made] == [()] * len(made)
    assert mf.full((), 2.0).item() == 2.0


def test_like_factories_and_a_factory_inside_build():
    """``zeros_like`` / ``ones_like`` keep the input's shape and dtype; a factory called in a
    traced forward (nanoGPT's positions) is a constant of the graph."""
    x = mf.tensor(np.ones((2, 3), np.float64))
    assert mf.zeros_like(x).dtype == mf.float64 and mf.ones_like(x).numpy().sum() == 6
    assert mf.ones_like(x, dtype=mf.float32).dtype == mf.float32
    emb = nn.Embedding(5, 2)

    class Positions(nn.Graph):
        def __init__(self):
            super().__init__()
            self.emb = emb

        def build(self, x):
            return x + self.emb(mf.arange(0, x.shape[1], dtype=mf.int64))

    out = Positions()(np.zeros((1, 4, 2), np.float32))
    np.testing.assert_array_equal(out.numpy()[0], emb.weight.numpy()[:4])


def test_factories_refuse_what_they_cannot_make():
    with pytest.raises(TypeError, match=r"zeros\(\): size must be integers"):
        mf.zeros(2.5)
    with pytest.raises(ValueError, match="nn.Parameter"):
        mf.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match="not this process's device"):
        mf.zeros(2, device="meta")
    with pytest.raises(ValueError, match=r"arange\(\): upper bound and lower bound inconsistent "
                                         "with step sign"):
        mf.arange(0, 5, -1)
    with pytest.raises(ValueError, match="step must be nonzero"):
        mf.arange(0, 5, 0)
    with pytest.raises(TypeError, match="tuple or list"):
        mf.full(3, 1.0)


def test_tensor_device_is_the_process_device_as_a_torch_device():
    """``Tensor.device`` (nanoGPT: ``device = idx.device``, then ``torch.arange(..., device=
    device)``) is the process's backend as ``torch.device`` writes it, and goes back into every
    ``device=``; ``miniflow.device`` parses and compares as PyTorch's."""
    x = mf.tensor(np.zeros(3, np.float32))
    dev = x.device
    backend = mf.get_backend().name
    assert str(dev) == ("cuda:0" if backend == "cuda" else "cpu") and dev.type == backend
    assert mf.arange(0, 3, device=dev).numpy().tolist() == [0, 1, 2]
    assert x.to(dev) is x and nn.Linear(2, 2, device=dev).weight.device == dev
    assert mf.device("cuda:1") == mf.device("cuda", 1) != mf.device("cuda")
    assert repr(mf.device("cuda", 0)) == "device(type='cuda', index=0)"
    assert repr(mf.device("cpu")) == "device(type='cpu')" and mf.device("cpu") != "cpu"
    with pytest.raises(ValueError, match="not this process's device"):
        mf.zeros(2, device=mf.device("meta"))
    with pytest.raises(ValueError, match="must not include an index"):
        mf.device("cuda:0", 0)
    seen = []

    class Devices(nn.Graph):
        def build(self, x):
            seen.append(x.device)
            return x * 2.0

    Devices()(np.ones(2, np.float32))
    assert seen == [dev]
    torch = pytest.importorskip("torch")
    assert repr(torch.device("cuda", 0)) == repr(mf.device("cuda", 0))


def test_pytorchs_dtype_aliases_name_miniflows_dtypes():
    """``torch.long``, ``torch.float``, ``torch.half`` and ``torch.double`` (nanoGPT's
    ``dtype=torch.long``) are miniflow's int64, float32, float16 and float64; a star import
    hides no builtin."""
    assert (mf.long, mf.float, mf.half, mf.double) == (mf.int64, mf.float32, mf.float16,
                                                        mf.float64)
    assert mf.arange(0, 4, dtype=mf.long).dtype == mf.int64
    assert mf.tensor(np.ones(2)).to(mf.float).dtype == mf.float32
    names = {}
    exec("from miniflow import *", names)
    assert "float" not in names and "long" not in names


def test_random_factories_draw_pytorchs_distributions_from_miniflows_generator():
    """``torch.rand / randn / randint`` (a tutorial's ``nn.Parameter(torch.randn(1, 1, d))``,
    nanoGPT's ``torch.randint(len(data) - block_size, (batch_size,))``): PyTorch's shapes,
    dtypes and distributions, reproducible after ``miniflow.manual_seed``."""
    mf.manual_seed(1)
    n = mf.randn(200, 100)
    u = mf.rand((200, 100), dtype=mf.float64)
    i = mf.randint(3, 7, (20000,))
    assert (n.dtype, u.dtype, i.dtype) == (mf.float32, mf.float64, mf.int64)
    assert abs(n.numpy().mean()) < 0.02 and abs(n.numpy().std() - 1) < 0.02
    assert 0 <= u.numpy().min() and u.numpy().max() < 1 and abs(u.numpy().mean() - 0.5) < 0.01
    assert set(np.unique(i.numpy())) == {3, 4, 5, 6}
    assert mf.randint(5, [2, 3]).shape == (2, 3) and mf.randint(5, [2]).numpy().max() < 5
    mf.manual_seed(1)
    np.testing.assert_array_equal(mf.randn(200, 100).numpy(), n.numpy())
    with pytest.raises(ValueError, match="expects 'from' to be less than 'to'"):
        mf.randint(5, 5, (2,))
    with pytest.raises(TypeError, match="size must be a tuple or list"):
        mf.randint(5)
    with pytest.raises(TypeError, match="manual_seed"):
        mf.randn(2, generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="nn.Parameter"):
        mf.randn(2, requires_grad=True)


def test_from_numpy_keeps_the_arrays_dtype_as_nanogpts_get_batch_uses_it():
    """nanoGPT's ``get_batch``: ``torch.stack([torch.from_numpy((data[i:i+block_size])
    .astype(np.int64)) for i in ix])`` (``from_numpy`` was missing): the array's values and
    dtype (a copy: PyTorch shares the memory)."""
    data = np.arange(100, dtype=np.uint16)
    ix = mf.randint(len(data) - 8, (4,))
    x = mf.stack([mf.from_numpy((data[int(i):int(i) + 8]).astype(np.int64)) for i in ix])
    assert x.dtype == mf.int64 and x.shape == (4, 8)
    np.testing.assert_array_equal(x.numpy()[:, 1:] - x.numpy()[:, :-1], 1)
    assert mf.from_numpy(np.ones(2, np.float16)).dtype == mf.float16
    with pytest.raises(TypeError, match=r"expected np.ndarray \(got list\)"):
        mf.from_numpy([1, 2])
