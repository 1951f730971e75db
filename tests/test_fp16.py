"""fp16 <-> fp32/fp64 conversions of ``miniflow.kernels.cpu.fp16`` against NumPy, bit for bit, on
both paths (LLVM intrinsics and the integer fallback), plus the import-time path selection."""
import os
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest

from miniflow.kernels.cpu import fp16

PATHS = {
    "intrinsic": (fp16.widen_intrinsic, fp16.narrow_intrinsic),
    "fallback": (fp16.widen_fallback, fp16.narrow_fallback),
}
needs_f16c = pytest.mark.skipif(not fp16.target_has("f16c"), reason="target CPU has no F16C")
PATH_PARAMS = [pytest.param("intrinsic", marks=needs_f16c), "fallback"]


def _loops(widen, narrow):
    """``(widen_all, narrow_all)``: small njit loops over one path's conversion functions."""
    @numba.njit
    def widen_all(bits, out):
        for i in range(bits.size):
            out[i] = widen(bits[i])

    @numba.njit
    def narrow_all(x, out):
        for i in range(x.size):
            out[i] = narrow(x[i])

    return widen_all, narrow_all


@pytest.fixture(scope="module")
def kernels():
    """path name -> (widen_all, narrow_all)."""
    return {name: _loops(*fns) for name, fns in PATHS.items()}


def _assert_same_halves(got_bits, x):
    """``got_bits`` (uint16) equal ``x.astype(float16)`` bit for bit; NaN only needs NaN + sign."""
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    got = got_bits.view(np.float16)
    assert np.isnan(got[nan]).all()
    assert np.array_equal(np.signbit(got[nan]), np.signbit(x[nan]))
    bad = np.flatnonzero(got_bits[~nan] != want[~nan].view(np.uint16))
    assert bad.size == 0, f"first mismatches: x={x[~nan][bad[:5]]!r} got={got[~nan][bad[:5]]!r}"


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_widen_every_bit_pattern(path, kernels):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    got = np.empty(bits.size, np.float32)
    kernels[path][0](bits, got)
    nan = np.isnan(want)
    assert nan.sum() == 2 * 1023
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()
    assert np.array_equal(np.signbit(got[nan]), np.signbit(want[nan]))


SPECIAL = [65504.0, 65519.99, 65520.0, 65536.0, 1e6, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-26,
           2.0**-14, 2.0**-14 * (1 - 2.0**-11), 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 0.0, -0.0,
           np.inf, -np.inf, np.nan, -np.nan, 3.4e38, 1e-45]


def _random_floats(n, seed):
    """Mixed magnitudes from 2^-40 (below fp16 subnormals) to 2^20 (overflow), both signs."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) * np.exp2(rng.uniform(-40, 20, n))


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_narrow_float32_matches_numpy(path, kernels):
    special = np.array(SPECIAL + [-v for v in SPECIAL], np.float32)
    x = np.concatenate([special, _random_floats(10**6, 0).astype(np.float32)])
    got = np.empty(x.size, np.uint16)
    kernels[path][1](x, got)
    _assert_same_halves(got, x)


@pytest.mark.parametrize("path", PATH_PARAMS)
def test_narrow_every_float16_value_and_midpoint(path, kernels):
    """Every finite fp16 value, and every midpoint between neighbours (ties to even), and +-1 ulp."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    v = np.sort(h[np.isfinite(h)].astype(np.float32))
    mid = (v[:-1].astype(np.float64) + v[1:]) / 2
    mid = mid.astype(np.float32)
    x = np.concatenate([v, mid, np.nextafter(mid, np.float32(np.inf)),
                        np.nextafter(mid, np.float32(-np.inf))])
    got = np.empty(x.size, np.uint16)
    kernels[path][1](x, got)
    _assert_same_halves(got, x)


def test_narrow64_matches_numpy():
    """float64 -> fp16 rounds once (no double rounding through float32)."""
    @numba.njit
    def narrow_all(x, out):
        for i in range(x.size):
            out[i] = fp16.narrow64(x[i])

    # 1 + 2^-11 + 2^-40 is just above a fp16 tie; via float32 it would round to the tie, then down.
    x = np.concatenate([np.array(SPECIAL + [1 + 2.0**-11 + 2.0**-40, -(1 + 2.0**-11 + 2.0**-40)]),
                        _random_floats(10**5, 1)])
    got = np.empty(x.size, np.uint16)
    narrow_all(x, got)
    _assert_same_halves(got, x)


def test_selected_path():
    assert fp16.PATH in ("intrinsic", "fallback")
    if fp16.PATH == "intrinsic":
        assert fp16.widen is fp16.widen_intrinsic and fp16.narrow is fp16.narrow_intrinsic
    assert fp16.JIT_CACHE == (not fp16.FORCE_FALLBACK)


_KERNEL_SCRIPT = textwrap.dedent("""
    import numpy as np
    from miniflow.dtype import float16, float32
    from miniflow.ir import Node, Value
    from miniflow.kernels.cpu import builder_for, fp16
    from miniflow.ops import get_op
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(5000) * np.exp2(rng.uniform(-30, 18, 5000))).astype(np.float32)
    for op, src, attrs, want in [
        ("cast", x, {"dtype": float16}, x.astype(np.float16)),
        ("scalar_mul", x.astype(np.float16), {"scalar": 3.0},
         (x.astype(np.float16).astype(np.float32) * np.float32(3.0)).astype(np.float16)),
    ]:
        node = Node(get_op(op), [Value("a", src.shape, src.dtype)],
                    [Value("o", src.shape, float16)], attrs)
        out = np.empty(src.shape, np.float16)
        for fn, args in builder_for(node.op)(node, [src], [out]):
            fn(*args)
        assert np.array_equal(out.view(np.uint16), want.view(np.uint16)), op
    print("PATH", fp16.PATH, "CACHE", fp16.JIT_CACHE)
""")


@pytest.mark.parametrize("env,expect", [
    ({"MINIFLOW_FP16_FALLBACK": "1"}, "PATH fallback CACHE False"),
    ({"NUMBA_CPU_NAME": "generic"}, "PATH fallback CACHE True"),
])
def test_fallback_selected_in_kernels(env, expect, tmp_path):
    """Kernels on the fallback path (forced, or a generic CPU) are bit-exact with NumPy too."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), **env)
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", _KERNEL_SCRIPT], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout
