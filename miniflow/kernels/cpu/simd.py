"""Explicit SIMD for Numba CPU kernels: the target's float32 vector type and the operations on it.

Why: LLVM's loop vectorizer only vectorizes a kernel's innermost loop. A matrix-multiply
micro-kernel needs the opposite: a block of the output held in vector registers while the loop
over the inner dimension runs, each loaded vector of ``b`` feeding several rows (Goto and van de
Geijn, "Anatomy of high-performance matrix multiplication", ACM TOMS 34(3), 2008; the BLIS
micro-kernel). Plain Numba code cannot say "keep these vectors in registers": scalar
accumulators are not vectorized across columns (measured: 6 GFLOP/s), and accumulating into the
output in memory is bound by loads and stores (48% of the single-core peak). With vector values
Numba hands LLVM exactly the register tile, as the C intrinsics of a BLAS micro-kernel do.

``f32vec`` is a Numba type whose data model is LLVM's ``<LANES x float>``, ``LANES`` the float32
lanes of one vector register of the CPU Numba compiles for (``target.ISA``: 16 with AVX-512, 8
with AVX2, 4 with NEON or SSE), so that a register tile of ``f32vec`` values is that many
registers (a 16-lane type on AVX2 would be two registers per value, and a tile sized for
AVX-512's 32 registers would spill on AVX2's 16). Operations (njit only; each is one or two LLVM
instructions; below, ``L`` = ``LANES``):

* ``vload(a, i, j)``: the ``L`` elements ``a[i, j:j + L]`` of a 2-D array whose last axis has unit
  stride, as float32: float32 arrays directly, float16 bits (``uint16``, see ``fp16``) widened with
  ``fpext`` (one ``vcvtph2ps``; only when ``fp16.PATH == "intrinsic"``, else a typing error) and
  bfloat16 bits (``int16``) shifted into the upper half of each lane (exact).
* ``vstore(a, i, j, v)``: ``a[i, j:j + L] = v``, rounded once to ``a``'s type (float32,
  float16 bits with ``fptrunc`` on the ``"intrinsic"`` path, bfloat16 bits to nearest even).
* ``vload_at(a, i)``, ``vstore_at(a, i, v)``: the same for ``a[i:i + L]`` of a 1-D array of unit
  stride (a kernel's flat view, ``common.flat``).
* ``vstore_bf16_pair(c, i, x, y)``: ``c[i:i + 2 L]`` (bfloat16 bits, 1-D) ``= x`` then ``y``,
  rounded as ``vstore`` rounds, with one narrowing of both vectors and one NaN test for both
  (the float32 -> bfloat16 copy of a loop that makes two vectors at a time; see the function).
* ``x + y``, ``x - y``, ``x * y`` on two ``f32vec``: lane by lane, each lane rounded as the
  float32 operation (no fast-math flags, no contraction into FMAs), so a scalar body of
  ``kernels.common`` (``sgd_element``) given vectors computes every lane's bits as it computes
  one element.
* ``vtranspose_block(a, i, j, out, p, q)``: ``out[p:p + L, q:q + L] = a[i:i + L, j:j + L].T``
  in registers, widened from ``a``'s type and rounded to ``out``'s (a transposing copy without
  the cache misses of an element-by-element one: 1024 x 1024 float16 into float32 in about
  220 us with 16 lanes, where a blocked scalar loop takes 580 and NumPy's ``copyto`` of a ``.T``
  view 3900).
* ``vcount_nonfinite(a, v)``: how many lanes of ``v`` are inf or NaN once rounded to ``a``'s type
  (a loss-scaling check fused into the kernel that writes ``a``).
* ``vsplat(x)``: a scalar (converted to float32) in every lane.
* ``vzero()``: ``L`` zeros.
* ``vfma(x, y, z)``: ``x * y + z`` with one rounding per lane (``llvm.fma``); ``fma_scalar`` the same
  for float32 and float64 scalars.
* ``vfold8(x, y)``, ``vfold4``, ``vfold2``, ``vfold1`` (``fold_intrinsic(h)``): lane sums of
  two vectors in groups: each group of ``2 h`` lanes of ``x`` summed pairwise into ``h`` lanes
  (lane ``t`` plus lane ``t + h``), ``x``'s groups in the lower half of the result, ``y``'s in
  the upper (None where ``2 h`` does not divide ``L``: ``vfold8`` needs 16 lanes). With 16 lanes,
  four levels sum 16 vectors into one whose lane ``l`` is vector ``l``'s sum (dot products'
  horizontal sums, 15 shuffle pairs where one sum at a time takes 64), in a fixed order.
* ``vlane(v, l)``: lane ``l`` of ``v`` (a float32).
* ``tile_intrinsic(rows, vectors)``: an intrinsic running a whole register tile of ``vfma`` over
  packed operands (``packed_gemm``'s micro-kernel), generated as LLVM IR for the tile's shape.

bfloat16 dot products (``HAS_BF16_DOT``: the target CPU has AVX512-BF16, so ``L`` is 16). ``bf16x32``
is 32 bfloat16 values as 16 pairs, the operand of ``vdpbf16ps`` (LLVM's
``llvm.x86.avx512bf16.dpbf16ps.512``), which adds to each float32 lane the two products of its
pair, twice the multiply-adds of one ``vfma``:

* ``vload_pairs(a, p, j)``: the pairs ``(a[p, j + l], a[p + 1, j + l])`` for ``l < 16``, two rows
  of bfloat16 bits interleaved (an outer product's ``b`` operand, two steps of the inner loop).
* ``vload_run(a, i, j)``: the 32 values ``a[i, j:j + 32]`` as 16 pairs (rows of pairs packed
  ahead, by ``matmul.transpose_kernel`` or ``matmul.interleave_pairs_kernel``).
* ``vsplat_pair(a, i, p)``: the pair ``(a[i, p], a[i, p + 1])`` in every lane (one 32-bit load
  where ``a`` is C-contiguous).
* ``vdot_pairs(acc, x, y)``: per lane, ``acc`` plus the two products of the lane's pairs (exact in
  float32; two additions, each rounded to nearest even). The instruction treats subnormal inputs
  as zero and flushes subnormal results to zero (Intel SDM, VDPBF16PS), as oneDNN's bfloat16
  GEMMs on it do: products below 2^-126 in magnitude are lost, where the float32 path keeps them.

Indices are not bounds-checked: the caller keeps ``j + L <= a.shape[1]`` (``j + 32`` for runs).

Every x86 intrinsic is emitted through :func:`_x86_intrinsic`, which refuses one whose feature
(:data:`X86_INTRINSICS`) the target lacks; everything else is target-independent LLVM IR (vector
types, ``shufflevector``, ``llvm.fma``, ``llvm.fabs``, ``llvm.ctpop``), which LLVM lowers for any
CPU, aarch64 included (``tests/test_simd.py`` compiles it for aarch64).
"""
from __future__ import annotations

import operator

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, overload, register_model

from . import fp16, target

__all__ = ["LANES", "HAS_BF16_DOT", "X86_INTRINSICS", "f32vec", "bf16x32", "vload", "vstore",
           "vcount_nonfinite", "vtranspose_block", "vsplat", "vzero", "vfma", "fma_scalar",
           "vload_pairs", "vload_run", "vsplat_pair", "vdot_pairs", "tile_intrinsic",
           "fold_intrinsic", "vfold8", "vfold4", "vfold2", "vfold1", "vlane", "vload_at",
           "vstore_at", "vstore_bf16_pair"]

LANES = target.ISA.lanes
"""float32 lanes of one vector (one register of the target: ``target.ISA``)."""
_VEC = ir.VectorType(ir.FloatType(), LANES)
_PAIRS = ir.VectorType(ir.IntType(16), 2 * LANES)
_I32 = ir.VectorType(ir.IntType(32), LANES)

HAS_BF16_DOT = fp16.target_has("avx512bf16") and LANES == 16
"""Whether the target CPU has AVX512-BF16's ``vdpbf16ps`` (then the rules' bfloat16 matmuls use
it; the tuner measures them against ``packed_gemm``'s float32 FMAs)."""

X86_INTRINSICS = {"llvm.x86.avx512bf16.dpbf16ps.512": "avx512bf16"}
"""Every x86 intrinsic this module emits -> the target feature it needs (``target.has``)."""


def _x86_intrinsic(builder, name: str, fnty):
    """The declaration of x86 intrinsic ``name`` in the module being built, or TypeError where the
    target lacks its feature (an x86 intrinsic on another CPU fails in LLVM's instruction
    selection, which aborts the process)."""
    feature = X86_INTRINSICS[name]
    if not target.has(feature):
        raise TypeError(f"{name}: the target CPU ({target.cpu()[1]}) has no {feature}")
    return cgutils.get_or_insert_function(builder.module, fnty, name)


class _VectorType(types.Type):
    """A Numba type whose values are the LLVM vector ``LLVM`` (named after the class)."""

    LLVM = None

    def __init__(self):
        super().__init__(name=type(self).__name__.lower())


class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, fe_type.LLVM)


class F32Vec(_VectorType):
    """``<LANES x float>``: one vector register of float32 lanes."""

    LLVM = _VEC


class BF16x32(_VectorType):
    """``<32 x i16>``: 32 bfloat16 values as 16 pairs."""

    LLVM = _PAIRS


for _vector in (F32Vec, BF16x32):
    register_model(_vector)(_VectorModel)
f32vec, bf16x32 = F32Vec(), BF16x32()


class _BFloat(ir.Type):
    """LLVM's ``bfloat`` (llvmlite has no such type; only the intrinsic's signature needs it)."""

    def _to_string(self):
        return "bfloat"

    def __eq__(self, other):
        return isinstance(other, _BFloat)

    def __hash__(self):
        return hash("bfloat")


_BF16_OPERAND = ir.VectorType(_BFloat(), 2 * LANES)


def _row_pointer(context, builder, aryty, ary, i, j, element, lanes=LANES):
    """A pointer to ``a[i, j]`` (``a[i]`` where ``j`` is None: a 1-D array), typed as pointing to
    ``lanes`` elements of type ``element``."""
    a = context.make_array(aryty)(context, builder, ary)
    shape, strides = (cgutils.unpack_tuple(builder, t) for t in (a.shape, a.strides))
    ptr = cgutils.get_item_pointer2(context, builder, a.data, shape, strides, aryty.layout,
                                    [i] if j is None else [i, j])
    return builder.bitcast(ptr, ir.VectorType(element, lanes).as_pointer())


def _index(context, builder, sig, args, k):
    return context.cast(builder, args[k], sig.args[k], types.intp)


def _check_2d(name, a, dtypes, ndim=2):
    if not (isinstance(a, types.Array) and a.ndim == ndim and a.dtype in dtypes):
        raise TypeError(f"{name}: expected a {ndim}-D array of {', '.join(map(str, dtypes))}, "
                        f"got {a}")


def _load_lanes(context, builder, aryty, ary, i, j):
    """``a[i, j:j + LANES]`` widened to ``<LANES x float>`` (``vload``; ``i``, ``j`` intp values;
    ``a[i:i + LANES]`` of a 1-D array where ``j`` is None)."""
    kind = aryty.dtype
    if kind == types.float32:
        return builder.load(_row_pointer(context, builder, aryty, ary, i, j, ir.FloatType()),
                            align=4)
    bits = builder.load(_row_pointer(context, builder, aryty, ary, i, j, ir.IntType(16)), align=2)
    if kind == types.uint16:                # IEEE binary16 bits
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES)), _VEC)
    wide = builder.zext(bits, ir.VectorType(ir.IntType(32), LANES))    # bfloat16 bits
    return builder.bitcast(builder.shl(wide, ir.Constant(wide.type, [16] * LANES)), _VEC)


def _lane_types():
    """The element types vectors load from and store to (float16 bits on F16C's path only)."""
    return [types.float32, types.int16] + ([types.uint16] if fp16.PATH == "intrinsic" else [])


@intrinsic
def vload(typingctx, a, i, j):
    """``a[i, j:j + LANES]`` as an ``f32vec`` (see the module docstring)."""
    _check_2d("vload", a, _lane_types())

    def codegen(context, builder, sig, args):
        i, j = _index(context, builder, sig, args, 1), _index(context, builder, sig, args, 2)
        return _load_lanes(context, builder, sig.args[0], args[0], i, j)

    return f32vec(a, i, j), codegen


def _store_lanes(context, builder, aryty, ary, i, j, v):
    """``a[i, j:j + LANES] = v`` rounded to ``a``'s type (``vstore``; ``i``, ``j`` intp values;
    ``a[i:i + LANES]`` of a 1-D array where ``j`` is None)."""
    kind = aryty.dtype
    if kind == types.float32:
        bits, element = v, ir.FloatType()
    elif kind == types.uint16:
        bits = builder.bitcast(builder.fptrunc(v, ir.VectorType(ir.HalfType(), LANES)),
                               ir.VectorType(ir.IntType(16), LANES))
        element = ir.IntType(16)
    else:
        bits, element = _narrow_bf16(builder, v), ir.IntType(16)
    builder.store(bits, _row_pointer(context, builder, aryty, ary, i, j, element),
                  align=4 if kind == types.float32 else 2)


@intrinsic
def vstore(typingctx, a, i, j, v):
    """``a[i, j:j + LANES] = v`` rounded once to ``a``'s type: float32 as is, float16 bits with
    ``fptrunc`` (IEEE round-to-nearest-even, overflow to inf; ``fp16.PATH == "intrinsic"`` only),
    bfloat16 bits rounded to nearest even in integers (NaN to the quiet NaN of its sign), as
    ``fp16.store`` does element by element."""
    _check_2d("vstore", a, _lane_types())

    def codegen(context, builder, sig, args):
        i, j = _index(context, builder, sig, args, 1), _index(context, builder, sig, args, 2)
        _store_lanes(context, builder, sig.args[0], args[0], i, j, args[3])
        return context.get_dummy_value()

    return types.none(a, i, j, v), codegen


@intrinsic
def vload_at(typingctx, a, i):
    """``a[i:i + LANES]`` of a 1-D array as an ``f32vec`` (widened as :func:`vload` widens)."""
    _check_2d("vload_at", a, _lane_types(), ndim=1)

    def codegen(context, builder, sig, args):
        i = _index(context, builder, sig, args, 1)
        return _load_lanes(context, builder, sig.args[0], args[0], i, None)

    return f32vec(a, i), codegen


@intrinsic
def vstore_at(typingctx, a, i, v):
    """``a[i:i + LANES] = v`` of a 1-D array, rounded as :func:`vstore` rounds."""
    _check_2d("vstore_at", a, _lane_types(), ndim=1)

    def codegen(context, builder, sig, args):
        i = _index(context, builder, sig, args, 1)
        _store_lanes(context, builder, sig.args[0], args[0], i, None, args[2])
        return context.get_dummy_value()

    return types.none(a, i, v), codegen


@intrinsic
def vstore_bf16_pair(typingctx, c, i, x, y):
    """``c[i:i + 2 LANES]`` (a 1-D array of bfloat16 bits) ``=`` ``x`` then ``y`` (two ``f32vec``),
    rounded to nearest even as :func:`vstore` rounds, NaN to the quiet NaN of its sign.

    Both vectors are rounded, concatenated and narrowed to ``2 LANES`` 16-bit lanes at once (as
    AVX2: one ``vpackusdw`` and one ``vpermq`` for 16 elements, where one vector at a time takes a
    ``vextractf128`` and a ``vpackusdw`` per 8), then stored; one compare (``x`` unordered with
    ``y``) tests both for NaN, and only where there is one a masked store writes the quiet NaNs
    over their lanes (``llvm.masked.store``). The select of :func:`vstore` costs a compare, a
    blend and the two operations of the quiet NaN per vector. A masked store, not a second
    plain store of a corrected vector: LLVM merges two plain stores behind a branch into one
    store of a phi, which loses the known zero upper halves of the rounded lanes (two
    ``vpblendw`` more per 16 elements). Target-independent IR."""
    _check_2d("vstore_bf16_pair", c, [types.int16], ndim=1)
    if not (x == f32vec and y == f32vec):
        raise TypeError(f"vstore_bf16_pair: expected two f32vec, got {x}, {y}")

    def codegen(context, builder, sig, args):
        x, y = args[2], args[3]
        n = 2 * LANES
        bits = ir.VectorType(ir.IntType(16), n)
        both = ir.Constant(ir.VectorType(ir.IntType(32), n), list(range(n)))
        ptr = _row_pointer(context, builder, sig.args[0], args[0],
                           _index(context, builder, sig, args, 1), None, ir.IntType(16), n)
        rounded = builder.shuffle_vector(_bf16_rounded(builder, x), _bf16_rounded(builder, y),
                                         both)
        builder.store(builder.trunc(rounded, bits), ptr, align=2)
        mask = builder.bitcast(builder.fcmp_unordered("uno", x, y), ir.IntType(LANES))
        with builder.if_then(builder.icmp_unsigned("!=", mask, ir.Constant(mask.type, 0)),
                             likely=False):
            v = builder.shuffle_vector(x, y, both)
            masked_store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                ir.VoidType(), [bits, bits.as_pointer(), ir.IntType(32),
                                ir.VectorType(ir.IntType(1), n)]),
                f"llvm.masked.store.v{n}i16.p0v{n}i16")
            builder.call(masked_store, [builder.trunc(_bf16_quiet(builder, v), bits), ptr,
                                        ir.Constant(ir.IntType(32), 2),
                                        builder.fcmp_unordered("uno", v, v)])
        return context.get_dummy_value()

    return types.none(c, i, x, y), codegen


def _vector_operator(op, name: str):
    """``op`` (``operator.add``, ...) on two ``f32vec``, or a number (converted to float32, in
    every lane: :func:`vsplat`) and an ``f32vec``: the LLVM instruction ``name`` per lane."""
    @intrinsic
    def vop(typingctx, x, y):
        def codegen(context, builder, sig, args):
            return getattr(builder, name)(*args)

        return f32vec(x, y), codegen

    @overload(op)
    def _op(x, y):
        if x == f32vec and y == f32vec:
            return lambda x, y: vop(x, y)
        if isinstance(x, types.Number) and y == f32vec:
            return lambda x, y: vop(vsplat(x), y)
        return None


for _op, _name in ((operator.add, "fadd"), (operator.sub, "fsub"), (operator.mul, "fmul")):
    _vector_operator(_op, _name)


def _transposed(builder, rows: list) -> list:
    """The ``LANES`` rows of the transpose of the ``LANES`` x ``LANES`` block whose rows are
    ``rows`` (``<LANES x float>`` values): log2(``LANES``) rounds of two-vector shuffles, round
    ``s`` (1, 2, 4, ...) exchanging bit ``s`` of the row index with bit ``s`` of the lane index
    (the butterfly transpose of AVX-512 code; LLVM picks the shuffle instructions)."""
    rows = list(rows)
    for s in (1 << b for b in range(LANES.bit_length() - 1)):
        low = [lane if not lane & s else LANES + lane - s for lane in range(LANES)]
        high = [lane + s if not lane & s else LANES + lane for lane in range(LANES)]
        low, high = (ir.Constant(_I32, mask) for mask in (low, high))
        for r in range(LANES):
            if not r & s:
                x, y = rows[r], rows[r + s]
                rows[r], rows[r + s] = (builder.shuffle_vector(x, y, low),
                                        builder.shuffle_vector(x, y, high))
    return rows


@intrinsic
def vtranspose_block(typingctx, a, i, j, out, p, q):
    """``out[p + l, q + r] = a[i + r, j + l]`` for ``r, l < LANES``: a ``LANES`` x ``LANES`` block
    of ``a`` transposed into ``out`` in registers (``LANES`` ``vload``, the shuffles of
    :func:`_transposed`, ``LANES`` ``vstore``: widened from ``a``'s type, rounded to ``out``'s)."""
    _check_2d("vtranspose_block", a, _lane_types())
    _check_2d("vtranspose_block", out, _lane_types())

    def codegen(context, builder, sig, args):
        i, j, p, q = (_index(context, builder, sig, args, k) for k in (1, 2, 4, 5))

        def plus(x, d):
            return builder.add(x, ir.Constant(x.type, d))

        rows = [_load_lanes(context, builder, sig.args[0], args[0], plus(i, r), j)
                for r in range(LANES)]
        for lane, row in enumerate(_transposed(builder, rows)):
            _store_lanes(context, builder, sig.args[3], args[3], plus(p, lane), q, row)
        return context.get_dummy_value()

    return types.none(a, i, j, out, p, q), codegen


def _bf16_lanes(builder, v):
    """``v``'s bits as ``<n x i32>`` (``n`` its lanes) and a function splatting a constant."""
    i32 = ir.VectorType(ir.IntType(32), v.type.count)
    return builder.bitcast(v, i32), lambda c: ir.Constant(i32, [c] * v.type.count)


def _bf16_rounded(builder, v):
    """``<n x float>`` -> ``<n x i32>``, each lane's bfloat16 bits rounded to nearest even
    (``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``; wrong for NaN: :func:`_bf16_quiet`)."""
    bits, splat = _bf16_lanes(builder, v)
    odd = builder.and_(builder.lshr(bits, splat(16)), splat(1))
    return builder.lshr(builder.add(builder.add(bits, splat(0x7FFF)), odd), splat(16))


def _bf16_quiet(builder, v):
    """``<n x float>`` -> ``<n x i32>``, each lane's quiet bfloat16 NaN of its sign."""
    bits, splat = _bf16_lanes(builder, v)
    return builder.or_(builder.and_(builder.lshr(bits, splat(16)), splat(0x8000)), splat(0x7FC0))


def _narrow_bf16(builder, v):
    """``<LANES x float>`` -> ``<LANES x i16>`` bfloat16 bits, round to nearest even (``fp16``'s
    ``_bf16_from_f32_bits`` on every lane)."""
    nan = builder.fcmp_unordered("uno", v, v)
    return builder.trunc(builder.select(nan, _bf16_quiet(builder, v), _bf16_rounded(builder, v)),
                         ir.VectorType(ir.IntType(16), LANES))


_LIMITS = {types.float32: float("inf"), types.uint16: 65520.0,
           types.int16: float(np.frombuffer(np.uint32(0x7F7F8000).tobytes(), np.float32)[0])}
"""The smallest float32 magnitude that is not finite once rounded to each storage type (float16:
65520 rounds to inf; bfloat16: 0x7F7F8000, halfway between its largest finite value and 2^128)."""


@intrinsic
def vcount_nonfinite(typingctx, a, v):
    """The number of lanes of ``v`` (int64) that are inf or NaN once rounded to ``a``'s type
    (``vstore``'s rounding): ``not |v| < limit``, in registers."""
    _check_2d("vcount_nonfinite", a, _lane_types())

    def codegen(context, builder, sig, args):
        v = args[1]
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC]),
                                              f"llvm.fabs.v{LANES}f32")
        limit = ir.Constant(_VEC, [_LIMITS[sig.args[0].dtype]] * LANES)
        bad = builder.fcmp_unordered("uge", builder.call(fabs, [v]), limit)     # NaN or >= limit
        mask_type = ir.IntType(LANES)
        mask = builder.bitcast(bad, mask_type)
        ctpop = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(mask_type, [mask_type]), f"llvm.ctpop.i{LANES}")
        return builder.zext(builder.call(ctpop, [mask]), ir.IntType(64))

    return types.int64(a, v), codegen


@intrinsic
def vsplat(typingctx, x):
    """``x`` (any number, converted to float32) in every lane."""

    def codegen(context, builder, sig, args):
        x = context.cast(builder, args[0], sig.args[0], types.float32)
        undef, zero = ir.Constant(_VEC, ir.Undefined), ir.Constant(ir.IntType(32), 0)
        lane0 = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
        return builder.shuffle_vector(builder.insert_element(undef, x, zero), undef, lane0)

    return f32vec(x), codegen


@intrinsic
def vzero(typingctx):
    """``LANES`` float32 zeros."""

    def codegen(context, builder, sig, args):
        return ir.Constant(_VEC, [0.0] * LANES)

    return f32vec(), codegen


@intrinsic
def vfma(typingctx, x, y, z):
    """``x * y + z`` lane by lane, rounded once (``llvm.fma.v<LANES>f32``)."""
    if not all(t == f32vec for t in (x, y, z)):
        raise TypeError(f"vfma: expected three f32vec, got {x}, {y}, {z}")

    def codegen(context, builder, sig, args):
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3),
                                             f"llvm.fma.v{LANES}f32")
        return builder.call(fma, args)

    return f32vec(x, y, z), codegen


def fold_intrinsic(half: int):
    """An intrinsic ``vfold(x, y)`` (two ``f32vec``): lane ``g h + t`` of the result, for ``g <
    LANES / (2 h)`` and ``t < h``, is ``x[2 g h + t] + x[2 g h + h + t]``; the same of ``y``
    from lane ``LANES / 2`` (see the module docstring; two shuffles and one addition)."""
    if half < 1 or LANES % (2 * half):
        raise ValueError(f"fold_intrinsic: half={half} does not divide {LANES} lanes in groups")
    first = [base + 2 * half * g + t for base in (0, LANES)
             for g in range(LANES // (2 * half)) for t in range(half)]
    picks = [ir.Constant(_I32, first), ir.Constant(_I32, [i + half for i in first])]

    @intrinsic
    def vfold(typingctx, x, y):
        if not (x == f32vec and y == f32vec):
            raise TypeError(f"vfold{half}: expected two f32vec, got {x}, {y}")

        def codegen(context, builder, sig, args):
            lo, hi = (builder.shuffle_vector(args[0], args[1], pick) for pick in picks)
            return builder.fadd(lo, hi)

        return f32vec(x, y), codegen

    return vfold


vfold8, vfold4, vfold2, vfold1 = (fold_intrinsic(h) if LANES % (2 * h) == 0 else None
                                  for h in (8, 4, 2, 1))


@intrinsic
def vlane(typingctx, v, lane):
    """Lane ``lane`` of ``v`` (float32; ``lane < LANES``, not checked)."""
    if not (v == f32vec and isinstance(lane, types.Integer)):
        raise TypeError(f"vlane: expected an f32vec and an integer, got {v}, {lane}")

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], args[1])

    return types.float32(v, lane), codegen


@intrinsic
def vload_pairs(typingctx, a, p, j):
    """Rows ``p`` and ``p + 1`` of bfloat16 bits, columns ``j:j + 16``, interleaved into pairs."""
    _check_2d("vload_pairs", a, [types.int16])

    def codegen(context, builder, sig, args):
        aryty, ary = sig.args[0], args[0]
        p, j = _index(context, builder, sig, args, 1), _index(context, builder, sig, args, 2)
        half = ir.VectorType(ir.IntType(16), LANES)
        rows = [builder.load(builder.bitcast(
            _row_pointer(context, builder, aryty, ary, q, j, ir.IntType(16)), half.as_pointer()),
            align=2) for q in (p, builder.add(p, ir.Constant(p.type, 1)))]
        order = [x for lane in range(LANES) for x in (lane, lane + LANES)]
        return builder.shuffle_vector(rows[0], rows[1],
                                      ir.Constant(ir.VectorType(ir.IntType(32), 2 * LANES), order))

    return bf16x32(a, p, j), codegen


@intrinsic
def vload_run(typingctx, a, i, j):
    """``a[i, j:j + 32]``, bfloat16 bits, as 16 pairs."""
    _check_2d("vload_run", a, [types.int16])

    def codegen(context, builder, sig, args):
        i, j = _index(context, builder, sig, args, 1), _index(context, builder, sig, args, 2)
        ptr = _row_pointer(context, builder, sig.args[0], args[0], i, j, ir.IntType(16))
        return builder.load(builder.bitcast(ptr, _PAIRS.as_pointer()), align=2)

    return bf16x32(a, i, j), codegen


@intrinsic
def vsplat_pair(typingctx, a, i, p):
    """The bfloat16 bits ``(a[i, p], a[i, p + 1])`` in every lane: where ``a``'s rows are
    contiguous (a C-layout array) one 32-bit load broadcast (``vpbroadcastd`` from memory),
    else two 16-bit loads through the strides (a ``.T`` view). No negative-index wraparound:
    Numba's ``a[i, p]`` tests and corrects each index, which with the two loads made a register
    tile's inner loop four times as long as its ``vdot_pairs``."""
    _check_2d("vsplat_pair", a, [types.int16])

    def codegen(context, builder, sig, args):
        aryty, ary = sig.args[0], args[0]
        i, p = _index(context, builder, sig, args, 1), _index(context, builder, sig, args, 2)
        i16, i32 = ir.IntType(16), ir.IntType(32)
        first = builder.bitcast(_row_pointer(context, builder, aryty, ary, i, p, i16),
                                i16.as_pointer())
        if aryty.layout == "C":
            word = builder.load(builder.bitcast(first, i32.as_pointer()), align=2)
        else:
            second = builder.bitcast(_row_pointer(context, builder, aryty, ary, i, builder.add(
                p, ir.Constant(p.type, 1)), i16), i16.as_pointer())
            lo, hi = (builder.zext(builder.load(x, align=2), i32) for x in (first, second))
            word = builder.or_(lo, builder.shl(hi, ir.Constant(i32, 16)))
        undef = ir.Constant(_I32, ir.Undefined)
        lane0 = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)
        one = builder.insert_element(undef, word, ir.Constant(i32, 0))
        return builder.bitcast(builder.shuffle_vector(one, undef, lane0), _PAIRS)

    return bf16x32(a, i, p), codegen


@intrinsic
def vdot_pairs(typingctx, acc, x, y):
    """``acc`` plus the two products of each lane's pairs (``vdpbf16ps``; see the module
    docstring)."""
    if not (acc == f32vec and x == bf16x32 and y == bf16x32):
        raise TypeError(f"vdot_pairs: expected f32vec, bf16x32, bf16x32, got {acc}, {x}, {y}")
    if not HAS_BF16_DOT:
        raise TypeError("vdot_pairs: the target CPU has no AVX512-BF16 (simd.HAS_BF16_DOT)")

    def codegen(context, builder, sig, args):
        dot = _x86_intrinsic(builder, "llvm.x86.avx512bf16.dpbf16ps.512",
                             ir.FunctionType(_VEC, [_VEC, _BF16_OPERAND, _BF16_OPERAND]))
        return builder.call(dot, [args[0]] + [builder.bitcast(v, _BF16_OPERAND) for v in args[1:]])

    return f32vec(acc, x, y), codegen


@intrinsic
def fma_scalar(typingctx, x, y, z):
    """``x * y + z`` for float32 or float64 scalars of one type, rounded once (``llvm.fma.f32`` /
    ``llvm.fma.f64``; on a CPU without FMA, libm's ``fma``): the scalar columns of a
    register-tile kernel, so that every element of its out is the same chain of ``vfma``
    roundings whatever the tile's width, and the polynomials of ``kernels.cpu.special`` (one
    rounding a Horner step, the same bits on every CPU)."""
    if x not in (types.float32, types.float64) or y != x or z != x:
        raise TypeError(f"fma_scalar: expected three float32 or three float64, got {x}, {y}, {z}")

    def codegen(context, builder, sig, args):
        ty = context.get_value_type(x)
        name = "llvm.fma.f32" if x == types.float32 else "llvm.fma.f64"
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name)
        return builder.call(fma, args)

    return x(x, y, z), codegen


def _data(context, builder, aryty, ary):
    """``(data pointer, shape values, stride values)`` of an array argument (strides in bytes)."""
    a = context.make_array(aryty)(context, builder, ary)
    return (a.data, cgutils.unpack_tuple(builder, a.shape),
            cgutils.unpack_tuple(builder, a.strides))


def tile_intrinsic(rows: int, vectors: int):
    """An intrinsic ``vtile(ap, bp, tile)``: the register tile of a packed GEMM (BLIS's
    micro-kernel, both operands packed), ``rows`` x ``vectors`` vectors of float32 accumulators
    held in registers while ``p`` runs over ``ap.shape[0]`` steps: ``ap`` float32 ``[steps,
    rows]`` (a column of ``A`` per step), ``bp`` float32 ``[steps, vectors * LANES]`` (a row of
    ``B`` per step); per step each of ``ap``'s ``rows`` values is broadcast into ``vectors``
    ``llvm.fma`` (one rounding each, in order of ``p``: the bits of :func:`vfma`'s tiles).
    Generated per shape (``target.ISA.packed``), where a Numba loop would need one source per
    shape.

    ``tile`` (float32 ``[rows, vectors * LANES]``) holds the accumulators: loaded before the
    loop, stored after it (so a caller splitting ``p`` into blocks continues the same chain of
    roundings). Each row of the three must be contiguous (their last axis of unit stride, checked
    by the caller: a packed buffer); rows may be any stride apart. Shapes are not checked: the
    caller keeps ``ap`` ``rows`` wide and ``bp`` and ``tile`` as wide as the tile.

    No ``vdpbf16ps`` variant: on one core of an Intel Xeon (Sapphire Rapids) the instruction
    issues one every two cycles (106 GFLOP/s with 4 to 24 independent accumulators, where
    ``vfmadd231ps`` reaches 214), and this tile on pairs ran at 98-103 GFLOP/s in L1 against
    155-177 on widened float32 (``benchmarks/README.md``, issue 23)."""

    @intrinsic
    def vtile(typingctx, ap, bp, tile):
        for name, arr in (("ap", ap), ("bp", bp), ("tile", tile)):
            if not (isinstance(arr, types.Array) and arr.ndim == 2
                    and arr.dtype == types.float32):
                raise TypeError(f"vtile: {name} must be a 2-D float32 array, got {arr}")

        def codegen(context, builder, sig, args):
            (pa, (steps, _), (sa, _)), (pb, _, (sb, _)), (pt, _, (st, _)) = (
                _data(context, builder, t, v) for t, v in zip(sig.args, args))
            i64 = ir.IntType(64)
            i8p = ir.IntType(8).as_pointer()
            pa, pb, pt = (builder.bitcast(x, i8p) for x in (pa, pb, pt))

            def at(base, offset, ty):       # a ``ty`` at ``offset`` bytes past ``base``
                return builder.bitcast(builder.gep(base, [offset]), ty.as_pointer())

            def const(v):
                return ir.Constant(i64, v)

            def tile_at(t):                 # accumulator t: tile[t // vectors, vector t % vectors]
                r, v = divmod(t, vectors)
                return at(pt, builder.add(builder.mul(st, const(r)), const(4 * LANES * v)), _VEC)

            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_VEC, [_VEC] * 3), f"llvm.fma.v{LANES}f32")
            n = rows * vectors
            init = [builder.load(tile_at(t), align=4) for t in range(n)]
            entry = builder.block
            loop = builder.append_basic_block("vtile.loop")
            done = builder.append_basic_block("vtile.done")
            builder.cbranch(builder.icmp_signed(">", steps, const(0)), loop, done)
            builder.position_at_end(loop)
            p = builder.phi(i64)
            accs = [builder.phi(_VEC) for _ in range(n)]
            p.add_incoming(const(0), entry)
            for acc, v in zip(accs, init):
                acc.add_incoming(v, entry)
            brow, arow = builder.mul(p, sb), builder.mul(p, sa)
            bv = [builder.load(at(pb, builder.add(brow, const(4 * LANES * v)), _VEC), align=4)
                  for v in range(vectors)]
            lane0 = ir.Constant(_I32, [0] * LANES)
            undef = ir.Constant(_VEC, ir.Undefined)
            new = []
            for r in range(rows):
                x = builder.load(at(pa, builder.add(arow, const(4 * r)), ir.FloatType()),
                                 align=4)
                x = builder.shuffle_vector(builder.insert_element(
                    undef, x, ir.Constant(ir.IntType(32), 0)), undef, lane0)
                new += [builder.call(fma, [x, bv[v], accs[r * vectors + v]])
                        for v in range(vectors)]
            nxt = builder.add(p, const(1))
            p.add_incoming(nxt, loop)
            for acc, v in zip(accs, new):
                acc.add_incoming(v, loop)
            builder.cbranch(builder.icmp_signed("<", nxt, steps), loop, done)
            builder.position_at_end(done)
            outs = [builder.phi(_VEC) for _ in range(n)]
            for t, out in enumerate(outs):
                out.add_incoming(init[t], entry)
                out.add_incoming(new[t], loop)
            for t, out in enumerate(outs):
                builder.store(out, tile_at(t), align=4)
            return context.get_dummy_value()

        return types.none(ap, bp, tile), codegen

    return vtile
