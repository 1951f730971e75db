"""bfloat16: the dtype, its conversions in the CPU kernels against ``ml_dtypes`` bit for bit (all
65536 patterns), NumPy interop, and AMP in bfloat16 (``enable_amp(dtype=miniflow.bfloat16)``)."""
import os

import ml_dtypes
import numpy as np
import pytest

import miniflow as mf
from miniflow.dtype import BF16_MAX, HALF_DTYPES, as_dtype
from miniflow.experiments.mlp import TrainGraph, mlp

BF16 = np.dtype(ml_dtypes.bfloat16)
ALL_BITS = np.arange(65536, dtype=np.uint16)


def _cast(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` through miniflow's cast kernel (eager op ``cast``)."""
    return mf.tensor(x).to(dtype).numpy()


def _numpy_cast(x: np.ndarray, dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(dtype)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    bits = f"u{want.dtype.itemsize}"
    bad = np.flatnonzero(got.view(bits) != want.view(bits))
    assert bad.size == 0, (f"{bad.size} elements differ, first at {bad[:3]}: "
                           f"{got.view(bits)[bad[:3]]} vs {want.view(bits)[bad[:3]]}")


def test_the_dtype():
    assert mf.bfloat16 is as_dtype("bfloat16") is as_dtype(ml_dtypes.bfloat16) is as_dtype(BF16)
    assert (mf.bfloat16.short, mf.bfloat16.itemsize, mf.bfloat16.np) == ("bf16", 2, BF16)
    assert mf.bfloat16.is_float and mf.bfloat16.is_half and mf.float16.is_half
    assert not mf.float32.is_half and HALF_DTYPES == (mf.float16, mf.bfloat16)
    assert BF16_MAX == float(np.array(0x7F7F, np.uint16).view(BF16).astype(np.float64))


def test_ml_dtypes_is_imported_by_the_first_use_of_bfloat16_np_only():
    """``import miniflow``, float32 and float16 arrays through the kernels and a checkpoint leave
    ``ml_dtypes`` unimported (its import takes about 0.6 s); ``bfloat16``'s name, size and
    half-ness need no import; ``bfloat16.np`` imports it, and then maps both ways."""
    script = """
import sys
import numpy as np
import miniflow as mf
from miniflow.dtype import as_dtype, is_bfloat16
from miniflow.kernels.cpu.common import kview
x = mf.tensor(np.ones((2, 3), np.float32))
y = (x.to(mf.float16) * 2).to(mf.float32).numpy()
assert kview(np.ones(2, np.float16)).dtype == np.uint16 and not is_bfloat16(np.float32)
assert (mf.bfloat16.itemsize, mf.bfloat16.is_half, mf.bfloat16.name) == (2, True, "bfloat16")
print("before", "ml_dtypes" in sys.modules)
import ml_dtypes
assert as_dtype(ml_dtypes.bfloat16) is mf.bfloat16 and is_bfloat16(ml_dtypes.bfloat16)
assert mf.bfloat16.np == np.dtype(ml_dtypes.bfloat16) and kview(y.astype(mf.bfloat16.np)).dtype == np.int16
"""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={**os.environ, "MINIFLOW_BACKEND": "cpu"}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "before False" in r.stdout


def test_widening_every_pattern_is_exact():
    """All 65536 bfloat16 patterns (NaNs, infs, subnormals included) to float32 and float64."""
    x = ALL_BITS.view(BF16)
    for dst in (np.float32, np.float64):
        got, want = _cast(x, dst), _numpy_cast(x, dst)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        _same_bits(got[~nan], want[~nan])
    _same_bits(_cast(x, np.float32), (ALL_BITS.astype(np.uint32) << 16).view(np.float32))


def test_narrowing_float32_rounds_to_nearest_even_like_ml_dtypes():
    """Every bfloat16 pattern as float32, and with the low 16 bits at the rounding edges (just
    below, at and just above the tie, the largest): round to nearest even, overflow to inf,
    subnormals kept, every NaN to the quiet NaN of its sign (``0x7FC0`` / ``0xFFC0``)."""
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    bits = ((ALL_BITS.astype(np.uint32) << 16)[:, None] | low[None, :]).ravel()
    x = bits.view(np.float32)
    _same_bits(_cast(x, mf.bfloat16), _numpy_cast(x, BF16))
    nan = _cast(np.array([np.nan, -np.nan], np.float32), mf.bfloat16).view(np.uint16)
    assert nan.tolist() == [0x7FC0, 0xFFC0]


def test_narrowing_float64_rounds_once():
    """float64 -> bfloat16 is one rounding: ``1 + 2^-8 + 2^-40`` is above the tie between 1 and
    ``1 + 2^-7`` and rounds up; through float32 it would be the tie itself and round to 1."""
    r = np.random.default_rng(0)
    with np.errstate(invalid="ignore"):
        patterns = (ALL_BITS.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    x = np.concatenate([r.standard_normal(200_000) * np.exp2(r.uniform(-140, 130, 200_000)),
                        patterns * (1 + 2.0 ** -9 + 2.0 ** -40),
                        [1 + 2.0 ** -8 + 2.0 ** -40, 3.3961776e38, 1e39, 2.0 ** -134, 1e-300]])
    got = _cast(x, mf.bfloat16)
    _same_bits(got, _numpy_cast(x, BF16))
    assert got[-5].view(np.uint16) == 0x3F81                 # 1 + 2^-7
    assert np.isinf(got[-3]) and got[-1] == 0


def test_float16_and_bfloat16_convert_into_each_other_exactly_once():
    x16 = ALL_BITS.view(np.float16)
    _same_bits(_cast(x16, mf.bfloat16), _numpy_cast(x16, BF16))
    xb = ALL_BITS.view(BF16)
    got, want = _cast(xb, mf.float16), _numpy_cast(xb.astype(np.float32), np.float16)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    _same_bits(got[~nan], want[~nan])


def test_arrays_in_and_out_are_ml_dtypes_bfloat16():
    x = np.array([[1.5, -2.0], [65536.0, 3e38]], BF16)
    t = mf.tensor(x)
    assert t.dtype is mf.bfloat16 and t.numpy().dtype == BF16
    y = (t * 2.0).numpy()
    assert y.dtype == BF16 and y[0, 0] == 3.0 and y[1, 0] == 131072.0 and np.isinf(y[1, 1])


def _train(dtype, scaler=None, steps=6, batch=32):
    mf.manual_seed(0)
    model = mlp((64, 128, 10))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if dtype is not None:
        graph.config.enable_amp(dtype=dtype)
    if scaler is not None:
        graph.set_grad_scaler(scaler)
    r = np.random.default_rng(0)
    x, y = r.random((batch, 64), dtype=np.float32), r.integers(0, 10, batch)
    return graph, [float(graph(x, y).numpy()) for _ in range(steps)]


def test_amp_in_bfloat16_trains_like_float32():
    _, ref = _train(None)
    graph, got = _train(mf.bfloat16)
    np.testing.assert_allclose(got, ref, rtol=2e-3)
    ir = str(graph._plans[next(iter(graph._plans))].graph)
    assert "bf16[32,128] = matmul" in ir and "f16[" not in ir.replace("bf16[", "")
    _, scaled = _train(mf.bfloat16, mf.amp.GradScaler())       # a scaler may still be set
    np.testing.assert_allclose(scaled, ref, rtol=2e-3)


def test_enable_amp_rejects_a_dtype_that_is_not_half():
    config = mf.nn.Graph().config
    with pytest.raises(TypeError, match="enable_amp: dtype must be a half type, miniflow.float16 "
                                        "or miniflow.bfloat16, got miniflow.float32"):
        config.enable_amp(dtype=mf.float32)
