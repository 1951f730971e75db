"""``kernels.cpu.simd``: the target's vectors (16, 8 or 4 lanes) load, round, store and count bit
for bit as NumPy and ml_dtypes convert element by element (NaN stays NaN of its sign; a signaling
NaN comes out quiet, as from the F16C instructions and miniflow's scalar conversions, where NumPy
keeps it signaling)."""
import re

import ml_dtypes
import numba
import numpy as np
import pytest

from miniflow.kernels.cpu import fp16
from miniflow.kernels.cpu.matmul import transpose_kernel
from miniflow.kernels.cpu.simd import (HAS_BF16_DOT, LANES, fold_intrinsic, tile_intrinsic,
                                       vcount_nonfinite, vdot_pairs, vfma, vfold1, vfold2, vfold4,
                                       vfold8, vlane, vload, vload_at, vload_pairs, vsplat,
                                       vsplat_pair, vstore, vstore_at, vstore_bf16_pair,
                                       vtranspose_block, vzero)

HALVES = [np.float16, ml_dtypes.bfloat16]
BITS = {np.float16: np.uint16, ml_dtypes.bfloat16: np.int16}


@numba.njit
def _round_trip(src, dst):
    """dst[i, :] = src[i, :] (vload then vstore, LANES at a time); the non-finite count."""
    bad = 0
    for i in range(src.shape[0]):
        for j in range(0, src.shape[1], LANES):
            v = vload(src, i, j)
            vstore(dst, i, j, v)
            bad += vcount_nonfinite(dst, v)
    return bad


@numba.njit
def _axpy(x, a, y, out):
    """out[0, :16] = a * x[0, :16] + y[0, :16] with one rounding (vfma), LANES at a time."""
    for j in range(0, 16, LANES):
        vstore(out, 0, j, vfma(vsplat(a), vload(x, 0, j), vfma(vzero(), vzero(), vload(y, 0, j))))


@numba.njit
def _pairs(src, bf16, out):
    """bf16[i:i + 2 LANES] = src's two vectors (vstore_bf16_pair); out = x * y - x + y (the
    vector operators), both 1-D, 2 LANES at a time."""
    for i in range(0, src.size, 2 * LANES):
        x, y = vload_at(src, i), vload_at(src, i + LANES)
        vstore_bf16_pair(bf16, i, x, y)
        vstore_at(out, i, x * y - x + y)
        vstore_at(out, i + LANES, y * x - y + x)


def _assert_same(got_bits, want_bits, kind):
    """Bit for bit, except that a NaN only needs to be a NaN of the same sign."""
    got, want = got_bits.view(kind), want_bits.view(kind)
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(np.signbit(got.astype(np.float32)),
                                  np.signbit(want.astype(np.float32)))
    np.testing.assert_array_equal(got_bits[~nan], want_bits[~nan])


def _specials() -> np.ndarray:
    """float32 values around every rounding edge: halfway cases of both half types, their
    overflow thresholds, subnormals, signed zeros, inf and NaN, and random values."""
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, 65519.996, 65520.0,
                      -65520.0, 6e-8, 3e-8, 2.98e-8, 1e-45, -1e-45, 1.0 + 2.0 ** -8,
                      1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11],
                     np.float32)
    bits = np.array([0x7F7F7FFF, 0x7F7F8000, 0xFF7F8000, 0x3F808000, 0x3F818000, 0x7FC00001,
                     0xFF800001], np.uint32).view(np.float32)
    r = np.random.default_rng(0)
    rand = (r.standard_normal(4096) * np.exp(r.uniform(-30, 30, 4096))).astype(np.float32)
    x = np.concatenate([edges, bits, rand])
    return np.resize(x, (len(x) + 15) // 16 * 16).reshape(-1, 16)


@pytest.mark.parametrize("half", HALVES, ids=lambda t: np.dtype(t).name)
def test_vstore_rounds_float32_as_numpy_and_ml_dtypes_do(half):
    if half is np.float16 and fp16.PATH != "intrinsic":
        pytest.skip("float16 vectors need F16C (fp16.PATH == 'intrinsic')")
    x = _specials()
    got = np.empty(x.shape, BITS[half])
    bad = _round_trip(x, got)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(half)
    _assert_same(got, want.view(BITS[half]), half)
    assert bad == np.count_nonzero(~np.isfinite(want.astype(np.float32))) > 0


@pytest.mark.parametrize("half", HALVES, ids=lambda t: np.dtype(t).name)
def test_vload_widens_every_half_pattern_exactly(half):
    if half is np.float16 and fp16.PATH != "intrinsic":
        pytest.skip("float16 vectors need F16C (fp16.PATH == 'intrinsic')")
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(BITS[half]).reshape(-1, 16)
    got = np.empty(bits.shape, np.float32)
    bad = _round_trip(bits, got)
    want = bits.view(half).astype(np.float32)
    _assert_same(got.view(np.uint32), want.view(np.uint32), np.float32)
    assert bad == np.count_nonzero(~np.isfinite(want))


def test_vstore_bf16_pair_rounds_as_vstore_and_the_operators_as_float32():
    """Two vectors narrowed at once (``vstore_bf16_pair``: one pack, one NaN test) store the bits
    of ``vstore``, NaN lanes included (the quiet NaN of their sign, wherever one falls in the
    pair); ``+``, ``-``, ``*`` on vectors round each lane as NumPy's float32 operations."""
    x = np.resize(_specials(), (64, 2 * LANES))
    for nan_at in (None, 0, LANES - 1, LANES, 2 * LANES - 1, "specials"):
        src = x.copy() if nan_at == "specials" else np.where(np.isnan(x), np.float32(1.5), x)
        if nan_at not in (None, "specials"):
            src[::3, nan_at] = np.frombuffer(np.uint32(0xFF812345).tobytes(), np.float32)[0]
        want = np.zeros(src.shape, np.int16)
        _round_trip(src, want)
        flat = src.reshape(-1)
        got, out = np.zeros(flat.size, np.int16), np.zeros(flat.size, np.float32)
        _pairs(flat, got, out)
        np.testing.assert_array_equal(got, want.reshape(-1))
        halves = flat.reshape(-1, 2, LANES)
        a, b = halves[:, 0], halves[:, 1]
        with np.errstate(all="ignore"):
            expect = np.stack([a * b - a + b, b * a - b + a], axis=1).reshape(-1)
        _assert_same(out.view(np.uint32), expect.view(np.uint32), np.float32)


def test_float32_round_trip_and_fma_round_once():
    x = _specials()
    got = np.empty_like(x)
    bad = _round_trip(x, got)
    _assert_same(got.view(np.uint32), x.view(np.uint32), np.float32)
    assert bad == np.count_nonzero(~np.isfinite(x))
    r = np.random.default_rng(1)
    a, xs, ys = np.float32(1 + 2.0 ** -12), r.standard_normal((1, 16)).astype(np.float32), \
        r.standard_normal((1, 16)).astype(np.float32)
    out = np.empty((1, 16), np.float32)
    _axpy(xs, a, ys, out)
    exact = (np.float64(a) * xs.astype(np.float64) + ys).astype(np.float32)    # one rounding
    np.testing.assert_array_equal(out, exact)


@numba.njit
def _block_transposed(src, i, j, dst, p, q):
    vtranspose_block(src, i, j, dst, p, q)


@pytest.mark.parametrize("kind", [np.float32, np.float16, ml_dtypes.bfloat16],
                         ids=lambda t: np.dtype(t).name)
def test_vtranspose_block_moves_every_element_of_its_block_exactly(kind):
    """One LANES x LANES block at an offset, every other element of out untouched; half bits widened
    exactly (every float16 / bfloat16 pattern appears in some block), float32 rounded to half
    bits as ``vstore`` rounds."""
    if kind is np.float16 and fp16.PATH != "intrinsic":
        pytest.skip("float16 vectors need F16C (fp16.PATH == 'intrinsic')")
    bits = BITS.get(kind, np.float32)
    if kind is np.float32:
        src = np.resize(_specials().reshape(-1), (37, 45))
    else:
        src = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(bits).reshape(256, 256)
    L = LANES
    for i, j in ((0, 0), (3, 5), (src.shape[0] - L, src.shape[1] - L)):
        out = np.full((src.shape[1] + 2, src.shape[0] + 3), -7.0, np.float32)
        _block_transposed(src, i, j, out, j + 1, i + 2)
        want = np.full_like(out, -7.0)
        want[j + 1:j + L + 1, i + 2:i + L + 2] = src[i:i + L, j:j + L].T.view(kind).astype(
            np.float32)
        _assert_same(out.view(np.uint32), want.view(np.uint32), np.float32)
    if kind is np.float32:                         # float32 in, half bits out: rounded
        for half in HALVES:
            if half is np.float16 and fp16.PATH != "intrinsic":
                continue
            out = np.zeros((L, L), BITS[half])
            _block_transposed(src, 0, 0, out, 0, 0)
            with np.errstate(over="ignore", invalid="ignore"):
                want = src[:L, :L].T.astype(half)
            _assert_same(out, want.view(BITS[half]), half)


@pytest.mark.parametrize("shape", [(16, 16), (1024, 256), (37, 45), (5, 3), (300, 17)])
@pytest.mark.parametrize("kind", [np.float32, np.float16, ml_dtypes.bfloat16],
                         ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("parallel", [False, True])
def test_transpose_kernel_copies_the_transpose_widened(shape, kind, parallel):
    """Full blocks, the rows and columns past them, and shapes smaller than one block."""
    if kind is np.float16 and fp16.PATH != "intrinsic":
        pytest.skip("float16 vectors need F16C (fp16.PATH == 'intrinsic')")
    x = np.random.default_rng(2).standard_normal(shape).astype(kind)
    out = np.full(shape[::-1], np.nan, np.float32)
    transpose_kernel(parallel)(x.view(BITS.get(kind, np.float32)), out)
    np.testing.assert_array_equal(out, x.T.astype(np.float32))


@pytest.mark.parametrize("shape", [(64, 32), (1000, 333), (7, 5)])
@pytest.mark.parametrize("parallel", [False, True])
def test_transpose_kernel_moves_any_32_bit_words_unchanged(shape, parallel):
    """A bfloat16 ``x @ W.T`` packs ``W``'s pairs as 32-bit words through float32 views: every
    pattern, NaNs with any payload and signalling NaNs included, comes out bit for bit."""
    words = np.random.default_rng(3).integers(0, 2 ** 32, shape, dtype=np.uint64).astype(np.uint32)
    words[0, :4] = [0x7F800001, 0xFF80FFFF, 0x7FC00000, 0x00000001]     # sNaNs, qNaN, subnormal
    out = np.zeros(shape[::-1], np.uint32)
    transpose_kernel(parallel)(words.view(np.float32), out.view(np.float32))
    np.testing.assert_array_equal(out, words.T)


def test_a_wrong_array_is_a_type_error():
    with pytest.raises(TypeError, match="vload: expected a 2-D array"):
        _round_trip(np.zeros((2, 16)), np.zeros((2, 16), np.float32))        # float64


@numba.njit
def _dot_pairs(acc, x, b, out):
    """out[0, :16] = acc[0, :16] + x[0, 0] * b[0, :16] + x[0, 1] * b[1, :16] (vdot_pairs)."""
    vstore(out, 0, 0, vdot_pairs(vload(acc, 0, 0), vsplat_pair(x, 0, 0), vload_pairs(b, 0, 0)))


def _bf16_bits(values) -> np.ndarray:
    return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).view(np.int16)


@pytest.mark.skipif(not HAS_BF16_DOT, reason="the target CPU has no AVX512-BF16")
def test_vdot_pairs_adds_the_products_of_rows_p_and_p_plus_1():
    r = np.random.default_rng(2)
    b = _bf16_bits(r.integers(-64, 64, (2, 16)))         # small integers: every sum is exact
    acc = r.integers(-1000, 1000, (1, 16)).astype(np.float32)
    x = _bf16_bits([[3.0, -5.0]])
    out = np.empty((1, 16), np.float32)
    b32 = b.view(ml_dtypes.bfloat16).astype(np.float32)
    column = _bf16_bits([[3.0, 7.0], [-5.0, 9.0]]).T     # a .T view: two loads, not one word
    assert not column.flags.c_contiguous
    for pair in (x, column):
        _dot_pairs(acc, pair, b, out)
        np.testing.assert_array_equal(out, acc + 3 * b32[:1] - 5 * b32[1:])
    x[0, 0] = _bf16_bits(2.0 ** -130)[()]              # a bfloat16 subnormal: read as zero
    _dot_pairs(acc, x, b, out)
    np.testing.assert_array_equal(out, acc - 5 * b32[1:])


_FOLD_A, _FOLD_B = fold_intrinsic(LANES // 2), fold_intrinsic(LANES // 4)


@numba.njit
def _fold_levels(v, out):
    """out[0] = fold(v[0], v[1]) at half LANES / 2, out[1] = fold(v[2], v[3]) at LANES / 4,
    out[2, :LANES] = lanes of v[0] one by one (vlane)."""
    vstore(out, 0, 0, _FOLD_A(vload(v, 0, 0), vload(v, 1, 0)))
    vstore(out, 1, 0, _FOLD_B(vload(v, 2, 0), vload(v, 3, 0)))
    first = vload(v, 0, 0)
    for lane in range(LANES):
        out[2, lane] = vlane(first, lane)


def test_fold_sums_lane_pairs_within_groups_x_first():
    """``fold_intrinsic(h)(x, y)``: lane ``g h + t`` is ``x[2 g h + t] + x[2 g h + h + t]``,
    ``y``'s groups from lane ``LANES / 2`` (the horizontal sums of ``dot_pairs_kernel``);
    ``vlane`` reads one lane; a half that does not split the lanes into groups is refused."""
    r = np.random.default_rng(4)
    v = r.uniform(-1, 1, (4, LANES)).astype(np.float32)
    out = np.zeros((3, LANES), np.float32)
    _fold_levels(v, out)
    for row, (x, y, h) in enumerate([(v[0], v[1], LANES // 2), (v[2], v[3], LANES // 4)]):
        want = [z[2 * h * g + t] + z[2 * h * g + h + t] for z in (x, y)
                for g in range(LANES // (2 * h)) for t in range(h)]
        np.testing.assert_array_equal(out[row], np.array(want, np.float32))
    np.testing.assert_array_equal(out[2], v[0])
    with pytest.raises(ValueError, match="does not divide"):
        fold_intrinsic(3)


@numba.njit
def _fold_tree(v, out):
    """out[0] = the four-level fold tree of v's 16 rows (dot_pairs_kernel's block sums)."""
    f8, f4, f2, f1 = vfold8, vfold4, vfold2, vfold1

    def pair(r):                    # rows r and r + 1 folded once
        return f8(vload(v, r, 0), vload(v, r + 1, 0))
    vstore(out, 0, 0, f1(f2(f4(pair(0), pair(2)), f4(pair(4), pair(6))),
                         f2(f4(pair(8), pair(10)), f4(pair(12), pair(14)))))


@pytest.mark.skipif(LANES != 16, reason="the four-level tree sums 16 vectors of 16 lanes")
def test_the_fold_tree_puts_vector_l_s_sum_in_lane_l_in_a_fixed_order():
    v = np.random.default_rng(6).uniform(-1, 1, (16, 16)).astype(np.float32)
    out = np.zeros((1, 16), np.float32)
    _fold_tree(v, out)
    for lane in range(16):                      # the order: halves, quarters, eighths, pairs
        x = v[lane]
        h = x[:8] + x[8:]
        q = h[:4] + h[4:]
        e = q[:2] + q[2:]
        assert out[0, lane] == e[0] + e[1]


_TILE_3X2 = tile_intrinsic(3, 2)


@numba.njit
def _tile(ap, bp, tile):
    _TILE_3X2(ap, bp, tile)


@pytest.mark.parametrize("steps", [0, 1, 5])
def test_vtile_adds_the_outer_products_of_the_packed_steps(steps):
    """tile[r, c] += sum over p of ap[p, r] * bp[p, c], with rows of ap and bp any stride apart
    (views into wider buffers): small integers, so every sum is exact."""
    r = np.random.default_rng(5)
    ap = r.integers(-9, 9, (steps, 5)).astype(np.float32)[:, 1:4]
    bp = r.integers(-9, 9, (steps, 2 * LANES + 3)).astype(np.float32)[:, :2 * LANES]
    tile = r.integers(-99, 99, (3, 2 * LANES)).astype(np.float32)
    want = tile + ap.T.astype(np.float64) @ bp
    _tile(ap, bp, tile)
    np.testing.assert_array_equal(tile, want)


def test_vtile_rounds_once_per_step():
    """Each step is one fused multiply-add per element: (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 keeps
    its last bit added to -1 (a separate multiply would round it away first)."""
    x = np.float32(1 + 2.0 ** -12)
    ap, bp = np.full((1, 3), x, np.float32), np.full((1, 2 * LANES), x, np.float32)
    tile = np.full((3, 2 * LANES), -1.0, np.float32)
    _tile(ap, bp, tile)
    np.testing.assert_array_equal(tile, np.float32(2.0 ** -11 + 2.0 ** -24))


def test_vtile_takes_float32_only():
    with pytest.raises(TypeError, match="vtile: bp must be a 2-D float32 array"):
        _tile(np.zeros((1, 3), np.float32), np.zeros((1, 2 * LANES), np.int16),
              np.zeros((3, 2 * LANES), np.float32))


# ----------------------------------------------------------------------------- every target
def _unoptimized_ir(fn, *args) -> list:
    """The LLVM IR modules Numba generates for ``fn`` (a kernel's Python function, compiled
    afresh, without the cache) on ``args``, before LLVM's passes for the host (which would lower
    parts of it to x86 intrinsics: NRT's atomics)."""
    from numba.core import codegen
    captured, add = [], codegen.CPUCodeLibrary.add_ir_module

    def capture(library, module):
        captured.append(str(module))
        return add(library, module)

    codegen.CPUCodeLibrary.add_ir_module = capture
    try:
        numba.njit(fn)(*args)
    finally:
        codegen.CPUCodeLibrary.add_ir_module = add
    return captured


def _kernels_ir() -> list:
    """The IR of kernels using every target-independent vector operation: the round trip,
    the fused multiply-add, the block transpose, the register tile (counted) and the packed
    GEMM's generated tile (into bfloat16, counted)."""
    from miniflow.kernels.cpu.matmul import outer_block_kernel
    from miniflow.kernels.cpu.packed_gemm import packed_kernel
    x = np.zeros((2, 4 * LANES), np.float32)
    tile = outer_block_kernel(False, True, "rows").py_func
    a, b = np.zeros((7, 5), np.float32), np.zeros((5, 9 * LANES + 3), np.float32)
    return (_unoptimized_ir(_round_trip.py_func, x, np.zeros_like(x))
            + _unoptimized_ir(_round_trip.py_func, x, np.zeros(x.shape, np.int16))
            + _unoptimized_ir(_pairs.py_func, x.reshape(-1), np.zeros(x.size, np.int16),
                              np.zeros(x.size, np.float32))
            + _unoptimized_ir(_axpy.py_func, x, np.float32(2), x, np.zeros_like(x))
            + _unoptimized_ir(_block_transposed.py_func, np.zeros((LANES, LANES), np.float32), 0,
                              0, np.zeros((LANES, LANES), np.float32), 0, 0)
            + _unoptimized_ir(tile, a, b, np.zeros((7, b.shape[1]), np.float32),
                              np.zeros(1, np.int64))
            + _unoptimized_ir(packed_kernel(False, *[np.dtype(np.int16)] * 3).py_func,
                              a.astype(np.int16), b.astype(np.int16),
                              np.zeros((7, b.shape[1]), np.int16), np.zeros(1, np.int64), True))


def test_no_x86_intrinsic_without_its_feature_gate(monkeypatch):
    """``simd`` names x86 intrinsics only in ``X86_INTRINSICS`` (each with its feature), emits
    them only through ``_x86_intrinsic``, which refuses one the target lacks, and the vector
    kernels that need no such feature emit none."""
    import ast
    import inspect
    from llvmlite import ir
    from miniflow.kernels.cpu import simd, target
    tree = ast.parse(inspect.getsource(simd))
    named = [n.value for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and n.value.startswith("llvm.x86.")]
    assert named and set(named) <= set(simd.X86_INTRINSICS), named
    assert set(simd.X86_INTRINSICS.values()) <= set(target.PROBED)
    source = inspect.getsource(simd)
    sources = [ast.get_source_segment(source, n) for n in ast.walk(tree)
               if isinstance(n, ast.Call) and getattr(n.func, "attr", None) ==
               "get_or_insert_function"]
    assert sources and all("llvm.x86" not in s for s in sources), sources
    calls = {m for text in _kernels_ir() for m in re.findall(r'@"?(llvm\.[\w.]+)', text)}
    assert calls and not {c for c in calls if c.startswith("llvm.x86.")}, calls
    assert f"llvm.fma.v{LANES}f32" in calls
    monkeypatch.setattr(target, "has", lambda feature: False)
    builder = ir.IRBuilder(ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), []), "f")
                           .append_basic_block())
    name = next(iter(simd.X86_INTRINSICS))
    with pytest.raises(TypeError, match=f"{re.escape(name)}: the target CPU .* has no"):
        simd._x86_intrinsic(builder, name, ir.FunctionType(ir.VoidType(), []))


AARCH64 = "aarch64-unknown-linux-gnu"


def _aarch64_machine():
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple(AARCH64)
    except RuntimeError:
        return None
    return target.create_target_machine(cpu="generic", features="+neon", opt=2)


@pytest.mark.skipif(_aarch64_machine() is None, reason="llvmlite's LLVM has no aarch64 target")
def test_the_vector_kernels_compile_for_aarch64():
    """The IR the vector kernels generate, retargeted to aarch64 (NEON), compiles, and the
    fused multiply-adds become NEON ``fmla`` (llvmlite's LLVM has every target it was built
    with; the wheels include AArch64)."""
    import llvmlite.binding as llvm
    machine = _aarch64_machine()
    fmla = 0
    for text in _kernels_ir():
        module = llvm.parse_assembly(re.sub(r"target (triple|datalayout) = .*\n", "", text))
        module.triple, module.data_layout = AARCH64, str(machine.target_data)
        module.verify()
        fmla += machine.emit_assembly(module).count("fmla")
    assert fmla > 0


def test_every_tile_fits_its_register_file_and_the_target_is_read_back():
    """Each row of ``target.TILES`` (BLIS / XNNPACK shapes): accumulators, loaded vectors of
    ``b`` and the broadcast fit the ISA's registers; the vectors are the target's width; an
    unknown feature is an error, not a silent False."""
    import llvmlite.binding as llvm
    from miniflow.kernels.cpu import target
    for isa in target.TILES.values():
        assert isa.registers_used() <= isa.registers, isa
    assert LANES == target.ISA.lanes and target.ISA in target.TILES.values()
    assert target.cpu()[1] == (numba.config.CPU_NAME or llvm.get_host_cpu_name())
    f16c = fp16.target_has("f16c") and not fp16.FORCE_FALLBACK
    assert fp16.PATH == ("intrinsic" if f16c else "fallback")
    with pytest.raises(ValueError, match="target.has: cannot probe 'sse9'"):
        target.has("sse9")
