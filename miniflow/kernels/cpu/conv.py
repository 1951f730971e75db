"""Convolutions on the CPU: ``conv2d``, ``conv_data_grad``, ``conv_filter_grad``,
``conv_bias_grad`` (their builders: ``kernels.common.conv``; these are the step makers).

Convolutions are GEMMs (NumPy's BLAS, ``np.dot`` into preallocated ``out=`` buffers) over an
im2col matrix built by a Numba kernel (Caffe's scheme, in the layout that needs no transposed
copy for NCHW):

* forward: ``out[n][g] = W[g] @ cols[g]``, ``W[g]`` the group's weight as ``[O/G, K]`` and
  ``cols[g]`` the group's rows of ``im2col(x[n])`` (``[K, OH*OW]``, ``K = C/G * kh * kw``), so the
  product lands in NCHW order. A pointwise convolution (1x1, stride 1, no padding) has
  ``cols = x[n]`` itself: no im2col.
* data gradient: ``dcols = W[g].T @ dy[n][g]`` (a transposed view: BLAS reads it in place), then
  :func:`col2im_kernel` adds every column back into its input position (pointwise: ``dx[n][g]``
  directly).
* filter gradient: ``dW[g] = sum_n dy[n][g] @ cols[g].T``, one product per sample added up.

3x3 convolutions with stride 1 (forward, data and filter gradients) on large enough outputs
(:data:`WINOGRAD_FROM`) use Winograd F(2x2, 3x3) instead (Lavin & Gray, "Fast Algorithms for
Convolutional Neural Networks", CVPR 2016): every 2x2 output tile is ``A^T [U * V] A`` with the
transformed weight ``U = G g G^T`` and input tile ``V = B^T d B`` (4x4), so the channel sums are
16 GEMMs ``[O, C] @ [C, tiles]`` doing 4/9 of im2col's multiply-adds, and the transforms are a few
additions per element. The data gradient is the same convolution of ``dy`` with the flipped,
transposed weight; the filter gradient multiplies the transformed ``dy`` tiles with ``V``.

Winograd against im2col is a measured choice (:func:`algorithm_steps`: ``tune`` times both for
each convolution's class on this machine, the rule above first, and keeps the rule unless the
other is clearly faster), and so is every GEMM of either (``matmul.gemm_steps``: BLAS at the
threads in force, BLAS on one thread, or the register tile ``matmul.outer_block_kernel``).

Otherwise two layouts, chosen when the plan is built (:data:`BATCH_BELOW`):

* per sample (large feature maps): one im2col scratch ``[K, OH*OW]`` reused by every sample, one
  GEMM per sample and group, each written straight into the output.
* batched (small feature maps, e.g. ResNet's 7x7 stage): the samples' columns side by side,
  ``[K, N*OH*OW]``, and one GEMM per group over the whole batch; outputs (and ``dy``) are moved
  between ``[N, C, HW]`` and ``[C, N*HW]`` by one transposing copy each. A GEMM with 49 columns
  runs far below BLAS's peak; with ``N * 49`` it runs near it, and the copies are small.

The loops vectorize only when written as loops from 0 over fresh slices
(``dst, src = seg[j0:j1], x[c, ih, j0*sw + off:]``): that made im2col 2x and col2im 4.6x faster
at 64x56x56 than ``for j in range(j0, j1): seg[j] = x[..., j + off]``. But a slice costs
(an atomic reference count), so strided rows are indexed in place and nothing else slices per
output row: on ResNet-18's 8x8 digits, im2col of a stride-2 3x3 convolution at batch 64 went from
5.8 to 1.1 ms, of a stride-1 one from 12.2 to 2.2 ms, col2im from 4.3 / 8.4 to 1.5 / 3.0 ms, and
ResNet-50's 3x3 at 56x56 (batch 2) from 3.9 to 0.8 ms (one thread, Sapphire Rapids class Xeon).

Precision: float16 and float32 compute in float32, float64 in float64. float16 inputs are widened
once (by im2col itself, the Winograd padding kernel, or a cast into a float32 scratch), the GEMMs
accumulate in float32, and every result is rounded once into the float16 output (a GPU fp16
GEMM's contract); col2im and the gradient sums also add in float32 and round once.
Parallel variants (``common.use_parallel``) are chosen when the plan is built.
"""
from __future__ import annotations

import functools

import numpy as np

from ..common import conv
from ..common.conv import cropped, live_taps
from ..common.precision import compute_dtype
from . import tune
from .common import jit, kview, loop_for, use_parallel
from .elementwise import cast_steps
from .fp16 import load, store, to_compute
from .matmul import gemm_steps
from .movement import fill_steps

__all__ = ["BATCH_BELOW", "WINOGRAD_FROM", "WINOGRAD_PAIRS", "TRANSPOSED_FROM", "valid_range",
           "im2col_kernel", "col2im_kernel", "bias_grad_kernel", "winograd_pad_kernel",
           "winograd_input_kernel", "winograd_output_kernel", "winograd_grad_kernel",
           "winograd_fits", "winograd_applies", "algorithm_steps", "forward_steps",
           "data_grad_steps", "filter_grad_steps", "bias_grad_steps", "BUILDERS"]

BATCH_BELOW = 128
"""Output positions per sample (``OH * OW``) below which a convolution's GEMMs run over the whole
batch at once (the batched layout, see the module docstring). Measured at 7x7 (1x1 2048->512,
batch 4): 4.09 / 4.25 / 4.46 ms (forward / data / filter gradient) batched against 4.54 / 5.16 /
5.75 per sample; at 14x14 the two layouts tie."""


# ----------------------------------------------------------------------------- im2col / col2im
@jit(False)
def valid_range(off, stride, size, count):
    """``[j0, j1)``: the outputs ``j`` of ``range(count)`` whose input ``j * stride + off`` lies
    in ``[0, size)``."""
    j0 = 0 if off >= 0 else (-off + stride - 1) // stride
    j1 = 0 if size - 1 - off < 0 else (size - 1 - off) // stride + 1
    j0 = min(j0, count)
    return j0, max(j0, min(j1, count))


@functools.cache
def im2col_kernel(parallel: bool):
    """``kernel(x, cols, window)``: ``cols[(c*kh + p)*kw + q, (n*OH + i)*OW + j] =
    x[n, c, i*sh - ph + p*dh, j*sw - pw + q*dw]`` (0 outside ``x``), widened to ``cols``' dtype.

    ``x`` is ``[N, C, H, W]`` (kernel view: float16 as uint16 bits; one sample ``x[n:n+1]`` for
    the per-sample layout), ``cols`` a 2-D compute-type array ``[C*kh*kw, N*OH*OW]`` (its rows
    contiguous), ``window`` is ``ConvGeometry.window()``: one call fills the whole batch. The
    parallel variant splits the rows.
    """
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, cols, window):
        kh, kw, sh, sw, ph, pw, dh, dw, oh, ow = window
        n_n, h, w = x.shape[0], x.shape[2], x.shape[3]
        for r_ in loop(cols.shape[0]):
            r = np.int64(r_)  # prange indices are unsigned
            c, p, q = r // (kh * kw), (r // kw) % kh, r % kw
            offh, offw = p * dh - ph, q * dw - pw
            i0, i1 = valid_range(offh, sh, h, oh)
            j0, j1 = valid_range(offw, sw, w, ow)
            row = cols[r]
            for n in range(n_n):
                base = n * oh * ow
                for k in range(base, base + i0 * ow):
                    row[k] = 0
                for i in range(i0, i1):
                    o, ih = base + i * ow, i * sh + offh
                    for j in range(o, o + j0):
                        row[j] = 0
                    if sw == 1:      # loops from 0 over fresh slices vectorize (4x faster)
                        dst, src = row[o + j0:o + j1], x[n, c, ih, j0 + offw:]
                        for j in range(j1 - j0):
                            dst[j] = load(src, j)
                    else:            # a slice costs more than a short strided row
                        for j in range(j0, j1):
                            row[o + j] = load(x, (n, c, ih, j * sw + offw))
                    for j in range(o + j1, o + ow):
                        row[j] = 0
                for k in range(base + i1 * ow, base + oh * ow):
                    row[k] = 0

    return kernel


@functools.cache
def col2im_kernel(narrow: bool, parallel: bool):
    """``kernel(dcols, acc, dx, window)``: the adjoint of :func:`im2col_kernel`: every
    ``dcols[(c*kh + p)*kw + q, (n*OH + i)*OW + j]`` added into ``acc[n, c, ih, iw]`` at the input
    position im2col read it from (``acc`` zeroed first; compute type ``[N, C, H, W]``; one sample
    for the per-sample layout).

    ``narrow``: ``dx`` (``[N, C, H*W]``, kernel view) is a separate lower-precision output and
    each finished plane of ``acc`` is rounded into it once; otherwise ``acc`` is the output itself
    and ``dx`` is not touched. The parallel variant splits the ``(n, c)`` planes (each owns its
    plane).
    """
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(dcols, acc, dx, window):
        kh, kw, sh, sw, ph, pw, dh, dw, oh, ow = window
        n_n, c_n, h, w = acc.shape
        for nc_ in loop(n_n * c_n):
            nc = np.int64(nc_)
            n, c = nc // c_n, nc % c_n
            plane = acc[n, c]
            plane[:] = 0
            for p in range(kh):
                offh = p * dh - ph
                i0, i1 = valid_range(offh, sh, h, oh)
                for q in range(kw):
                    row = dcols[(c * kh + p) * kw + q]
                    off = q * dw - pw
                    j0, j1 = valid_range(off, sw, w, ow)
                    for i in range(i0, i1):
                        ih, base = i * sh + offh, (n * oh + i) * ow
                        if sw == 1:    # as in im2col: fresh slices vectorize
                            dst = plane[ih, j0 + off:]
                            src = row[base + j0:base + j1]
                            for j in range(src.size):
                                dst[j] += src[j]
                        else:
                            for j in range(j0, j1):
                                plane[ih, j * sw + off] += row[base + j]
            if narrow:
                out = dx[n, c]
                for ih in range(h):
                    for iw in range(w):
                        store(out, ih * w + iw, plane[ih, iw])

    return kernel


@functools.cache
def bias_grad_kernel(parallel: bool):
    """``kernel(dy, out)``: ``out[c] = sum_{n, k} dy[n, c, k]`` (``dy`` ``[N, C, HW]`` kernel
    view), summed in the compute type, one channel per (parallel) iteration."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("reassoc",))
    def kernel(dy, out):
        n_n, c_n, hw = dy.shape
        for c_ in loop(c_n):
            c = np.int64(c_)
            acc = to_compute(dy, 0.0)
            for n in range(n_n):
                part = to_compute(dy, 0.0)
                row = dy[n, c]
                for k in range(hw):
                    part += load(row, k)
                acc += part
            store(out, c, acc)

    return kernel


# ----------------------------------------------------------------------------- Winograd F(2x2, 3x3)
WINOGRAD_FROM = 192
"""Tiled output positions (``4 * N * ceil(OH/2) * ceil(OW/2)``) from which a 3x3 stride-1
convolution uses Winograd: its 16 GEMMs do 4/9 of the multiply-adds of im2col's one, but the
weight transform writes ``16 * O * C`` values per call, which pays only on large enough outputs
(measured: 256 channels on 14x14 win at batch 1, 128 on 28x28 and 64 on 56x56 always)."""
WINOGRAD_PAIRS = 1 << 17
"""(out, in) channel pairs beyond which the threshold grows in proportion: the transformed weight
(16 floats a pair, 8 MiB here) no longer stays in cache (512 on 7x7: im2col wins at batch 4,
Winograd at batch 8)."""

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
WINOGRAD_WEIGHT = np.kron(_G, _G)
"""``[16, 9]``: the weight transform ``U = G g G^T`` of a 3x3 tap matrix ``g`` (row-major taps)
as one matrix, so the transform of every (out, in) channel pair is one GEMM."""


@functools.cache
def winograd_pad_kernel(parallel: bool):
    """``kernel(x, xp, ph, pw)``: ``xp[n, c]`` = ``x[n, c]`` zero-padded (``ph`` rows, ``pw``
    columns before it, zeros after) and widened to ``xp``'s compute type."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, xp, ph, pw):
        n_n, c_n, h, w = x.shape
        for nc_ in loop(n_n * c_n):
            nc = np.int64(nc_)
            n, c = nc // c_n, nc % c_n
            plane = xp[n, c]
            plane[:] = 0
            for i in range(h):
                dst, src = plane[i + ph, pw:pw + w], x[n, c, i]
                for j in range(w):
                    dst[j] = load(src, j)

    return kernel


@functools.cache
def winograd_input_kernel(parallel: bool):
    """``kernel(xp, v)``: ``v[4a + b, c, t] = (B^T d B)[a, b]`` for every 4x4 tile ``d`` of the
    padded input (tile ``t = (n*TH + ti)*TW + tj`` starts at row ``2 ti``, column ``2 tj``), with
    ``B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]`` (Lavin & Gray, "Fast
    Algorithms for Convolutional Neural Networks", 2016). Rows are combined first, then columns,
    a row of tiles at a time (vectorizes); the parallel variant splits the channels."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("contract",))
    def kernel(xp, v):
        n_n, c_n = xp.shape[0], xp.shape[1]
        th, tw = (xp.shape[2] - 2) // 2, (xp.shape[3] - 2) // 2
        for c_ in loop(c_n):
            c = np.int64(c_)
            for n in range(n_n):
                for ti in range(th):
                    x0, x1, x2, x3 = (xp[n, c, 2 * ti], xp[n, c, 2 * ti + 1],
                                      xp[n, c, 2 * ti + 2], xp[n, c, 2 * ti + 3])
                    t0 = (n * th + ti) * tw
                    for a in range(4):
                        v0, v1 = v[4 * a, c, t0:t0 + tw], v[4 * a + 1, c, t0:t0 + tw]
                        v2, v3 = v[4 * a + 2, c, t0:t0 + tw], v[4 * a + 3, c, t0:t0 + tw]
                        for j in range(tw):
                            k = 2 * j
                            if a == 0:
                                q0, q1, q2, q3 = (x0[k] - x2[k], x0[k + 1] - x2[k + 1],
                                                  x0[k + 2] - x2[k + 2], x0[k + 3] - x2[k + 3])
                            elif a == 1:
                                q0, q1, q2, q3 = (x1[k] + x2[k], x1[k + 1] + x2[k + 1],
                                                  x1[k + 2] + x2[k + 2], x1[k + 3] + x2[k + 3])
                            elif a == 2:
                                q0, q1, q2, q3 = (x2[k] - x1[k], x2[k + 1] - x1[k + 1],
                                                  x2[k + 2] - x1[k + 2], x2[k + 3] - x1[k + 3])
                            else:
                                q0, q1, q2, q3 = (x1[k] - x3[k], x1[k + 1] - x3[k + 1],
                                                  x1[k + 2] - x3[k + 2], x1[k + 3] - x3[k + 3])
                            v0[j], v1[j], v2[j], v3[j] = q0 - q2, q1 + q2, q2 - q1, q1 - q3

    return kernel


@functools.cache
def winograd_output_kernel(parallel: bool):
    """``kernel(m, out, th, tw)``: every 2x2 output tile ``A^T M A`` of the 16 products
    ``m[4a + b, o, t]``, ``A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]``, rounded once into ``out``
    ``[N, O, OH, OW]`` (kernel view; the last tile row / column is cut when OH / OW is odd). The
    parallel variant splits the output channels."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("contract",))
    def kernel(m, out, th, tw):
        n_n, o_n, oh, ow = out.shape
        for o_ in loop(o_n):
            o = np.int64(o_)
            for n in range(n_n):
                for ti in range(th):
                    t0 = (n * th + ti) * tw
                    for a in range(2):
                        i = 2 * ti + a
                        if i >= oh:
                            continue
                        y = out[n, o, i]
                        for j in range(tw):
                            t = t0 + j
                            if a == 0:
                                s0 = m[0, o, t] + m[4, o, t] + m[8, o, t]
                                s1 = m[1, o, t] + m[5, o, t] + m[9, o, t]
                                s2 = m[2, o, t] + m[6, o, t] + m[10, o, t]
                                s3 = m[3, o, t] + m[7, o, t] + m[11, o, t]
                            else:
                                s0 = m[4, o, t] - m[8, o, t] - m[12, o, t]
                                s1 = m[5, o, t] - m[9, o, t] - m[13, o, t]
                                s2 = m[6, o, t] - m[10, o, t] - m[14, o, t]
                                s3 = m[7, o, t] - m[11, o, t] - m[15, o, t]
                            store(y, 2 * j, s0 + s1 + s2)
                            if 2 * j + 1 < ow:
                                store(y, 2 * j + 1, s1 - s2 - s3)

    return kernel


@functools.cache
def winograd_grad_kernel(parallel: bool):
    """``kernel(dyp, mdy)``: ``mdy[4a + b, o, t] = (A dY A^T)[a, b]`` for every 2x2 tile ``dY`` of
    ``dyp`` (``dy`` zero-padded to even ``[N, O, 2 TH, 2 TW]``, compute type), ``A`` the 4x2
    transpose of the output transform's ``A^T``: the gradient of the output transform, which the
    filter gradient's GEMMs multiply with the input tiles. A row of tiles at a time, as
    :func:`winograd_input_kernel`; the parallel variant splits the output channels."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("contract",))
    def kernel(dyp, mdy):
        n_n, o_n = dyp.shape[0], dyp.shape[1]
        th, tw = dyp.shape[2] // 2, dyp.shape[3] // 2
        for o_ in loop(o_n):
            o = np.int64(o_)
            for n in range(n_n):
                for ti in range(th):
                    r0, r1 = dyp[n, o, 2 * ti], dyp[n, o, 2 * ti + 1]
                    t0 = (n * th + ti) * tw
                    for a in range(4):
                        m0, m1 = mdy[4 * a, o, t0:t0 + tw], mdy[4 * a + 1, o, t0:t0 + tw]
                        m2, m3 = mdy[4 * a + 2, o, t0:t0 + tw], mdy[4 * a + 3, o, t0:t0 + tw]
                        for j in range(tw):
                            k = 2 * j
                            if a == 0:
                                p, q = r0[k], r0[k + 1]
                            elif a == 1:
                                p, q = r0[k] + r1[k], r0[k + 1] + r1[k + 1]
                            elif a == 2:
                                p, q = r0[k] - r1[k], r0[k + 1] - r1[k + 1]
                            else:
                                p, q = -r1[k], -r1[k + 1]
                            m0[j], m1[j], m2[j], m3[j] = p, p + q, p - q, -q

    return kernel


def winograd_fits(g) -> bool:
    """Whether Winograd F(2x2, 3x3) computes the convolution: a 3x3 kernel, stride 1, dilation
    1, no groups."""
    return g.kh == g.kw == 3 and g.sh == g.sw == 1 and g.dh == g.dw == 1 and g.groups == 1


def winograd_applies(g) -> bool:
    """Whether the built-in rule picks Winograd F(2x2, 3x3) (the tuner may pick otherwise,
    :func:`algorithm_steps`): it fits (:func:`winograd_fits`) and there are at least
    ``WINOGRAD_FROM`` tiled output positions (more beyond ``WINOGRAD_PAIRS`` channel pairs)."""
    tiles = g.n * (-(-g.oh // 2)) * (-(-g.ow // 2))
    return winograd_fits(g) and 4 * tiles >= WINOGRAD_FROM * max(1.0, g.o * g.c / WINOGRAD_PAIRS)


def algorithm_steps(op: str, g, ins: list, out, make, fits: bool) -> list:
    """The steps of ``make(*ins, out, g, winograd)`` for the algorithm ``tune`` measured faster
    for this convolution's class on this machine (``op``, the geometry, the dtypes), Winograd
    or im2col, where Winograd ``fits``; the built-in rule (:func:`winograd_applies`) is the
    first candidate, and keeps ties (``tune.MARGIN``) and the ``MINIFLOW_MATMUL`` overrides."""
    rule = winograd_applies(g) and fits
    if not fits:
        return make(*ins, out, g, False)
    names = ("winograd", "im2col") if rule else ("im2col", "winograd")
    candidates = {name: (lambda node, i, o, wino=name == "winograd": make(*i, o[0], g, wino))
                  for name in names}
    key = (f"{op} {'/'.join(a.dtype.name for a in ins)} -> {out.dtype.name} n{g.n} c{g.c} "
           f"{g.h}x{g.w} o{g.o} 3x3 pad {g.ph},{g.pw}")
    return tune.choose("conv", key, None, ins, [out], candidates)


def winograd_steps(x, w, out, ph: int, pw: int, ct, steps: list) -> list:
    """Steps for ``out = conv2d(x, w)``, 3x3, stride 1, padding ``(ph, pw)``, by Winograd
    F(2x2, 3x3): ``U = G w G^T`` (one GEMM for all channel pairs), ``V = B^T d B`` of every 4x4
    input tile, 16 GEMMs ``M[k] = U[k] @ V[k]`` (``[O, C] @ [C, tiles]``, one batched
    ``np.matmul``), and ``out = A^T M A`` per 2x2 tile, rounded once. ``w`` is already in the
    compute type ``ct``; ``x`` and ``out`` may be float16 (widened by the padding kernel, rounded
    by the output transform)."""
    n, c, h, wd = x.shape
    o, oh, ow = out.shape[1], out.shape[2], out.shape[3]
    th, tw = -(-oh // 2), -(-ow // 2)
    xp = np.empty((n, c, 2 * th + 2, 2 * tw + 2), ct)
    u = np.empty((16, o, c), ct)
    v = np.empty((16, c, n * th * tw), ct)
    m = np.empty((16, o, n * th * tw), ct)
    kron = WINOGRAD_WEIGHT.astype(ct)
    steps += gemm_steps(kron, w.reshape(o * c, 9).T, u.reshape(16, o * c))
    steps.append((winograd_pad_kernel(use_parallel(xp.size) and n * c > 1),
                  (kview(x), xp, ph, pw)))
    steps.append((winograd_input_kernel(use_parallel(v.size) and c > 1), (xp, v)))
    steps += gemm_steps(u, v, m)
    steps.append((winograd_output_kernel(use_parallel(m.size) and o > 1), (m, kview(out), th, tw)))
    return steps


def winograd_filter_grad_steps(dy, x, target, ph: int, pw: int, ct, steps: list) -> list:
    """Steps for ``target = conv_filter_grad(dy, x)`` (3x3, stride 1, padding ``(ph, pw)``;
    ``target`` ``[O, C, 3, 3]`` in the compute type) by Winograd F(2x2, 3x3): with ``V`` the
    input tiles' transform and ``MdY = A dY A^T`` of every 2x2 tile of ``dy`` (zero-padded to
    even sizes by the padding kernel, widened), the gradient of
    ``U`` is ``dU[k] = MdY[k] @ V[k]^T`` (the 16 GEMMs sum over all tiles of the batch), and the
    weight's is ``G^T dU G`` for every channel pair: one GEMM ``dU^T @ WINOGRAD_WEIGHT``."""
    n, c = x.shape[:2]
    o, oh, ow = dy.shape[1], dy.shape[2], dy.shape[3]
    th, tw = -(-oh // 2), -(-ow // 2)
    xp = np.empty((n, c, 2 * th + 2, 2 * tw + 2), ct)
    v = np.empty((16, c, n * th * tw), ct)
    dyp = np.empty((n, o, 2 * th, 2 * tw), ct)
    mdy = np.empty((16, o, n * th * tw), ct)
    du = np.empty((16, o, c), ct)
    steps.append((winograd_pad_kernel(use_parallel(xp.size) and n * c > 1),
                  (kview(x), xp, ph, pw)))
    steps.append((winograd_input_kernel(use_parallel(v.size) and c > 1), (xp, v)))
    steps.append((winograd_pad_kernel(use_parallel(dyp.size) and n * o > 1),
                  (kview(dy), dyp, 0, 0)))
    steps.append((winograd_grad_kernel(use_parallel(mdy.size) and o > 1), (dyp, mdy)))
    steps += gemm_steps(mdy, v.transpose(0, 2, 1), du)
    steps += gemm_steps(du.reshape(16, o * c).T, WINOGRAD_WEIGHT.astype(ct),
                        target.reshape(o * c, 9))
    return steps


# ----------------------------------------------------------------------------- conv builders
def split(a: np.ndarray, groups: int) -> list:
    """``a``'s first axis cut into ``groups`` equal blocks (views): a grouped convolution's
    weight rows, im2col rows or channels of one group each."""
    k = a.shape[0] // groups
    return [a[i * k:(i + 1) * k] for i in range(groups)]


class _Conv:
    """What the three convolution builders share: the geometry, the compute type, the layout
    choice and the step list they append to (see the module docstring)."""

    def __init__(self, g, dtype):
        self.g, self.ct, self.steps = g, compute_dtype(dtype), []
        self.ohw = g.oh * g.ow
        self.batched = self.ohw < BATCH_BELOW and g.n > 1

    def scratch(self, *shape) -> np.ndarray:
        """A compute-type buffer allocated now, when the plan is built."""
        return np.empty(shape, self.ct)

    def widened(self, a: np.ndarray) -> np.ndarray:
        """``a`` in the compute type: itself, or a scratch that a step casts ``a`` into."""
        if a.dtype == self.ct:
            return a
        wide = self.scratch(*a.shape)
        self.steps += cast_steps(a, wide)
        return wide

    def target(self, out: np.ndarray) -> np.ndarray:
        """Where the GEMMs write ``out``: itself, or a compute-type scratch (see :meth:`finish`)."""
        return out if out.dtype == self.ct else self.scratch(*out.shape)

    def finish(self, target: np.ndarray, out: np.ndarray) -> list:
        """The steps, ending with the one rounding of ``target`` into ``out`` when they differ."""
        if target is not out:
            self.steps += cast_steps(target, out)
        return self.steps

    def weight(self, w: np.ndarray) -> list:
        """The groups' weights as ``[O/G, K]`` compute-type blocks."""
        return split(self.widened(w).reshape(self.g.o, self.g.kg), self.g.groups)

    def gemms(self, a_blocks, b_blocks, out_blocks) -> None:
        """One GEMM ``out = a @ b`` per group (``matmul.gemm_steps``: BLAS, or what the tuner
        measured faster for its class)."""
        self.steps += [step for abo in zip(a_blocks, b_blocks, out_blocks)
                       for step in gemm_steps(*abo)]

    def to_columns(self, a: np.ndarray) -> np.ndarray:
        """A scratch ``[C, N*HW]`` and the step copying ``a`` ``[N, C, H, W]`` into it."""
        n, c = a.shape[:2]
        cols = self.scratch(c, a.size // c)
        self.steps.append((np.copyto, (cols.reshape(c, n, -1),
                                       a.reshape(n, c, -1).transpose(1, 0, 2))))
        return cols

    def from_columns(self, cols: np.ndarray, out: np.ndarray) -> None:
        """The step copying ``cols`` ``[C, N*HW]`` into ``out`` ``[N, C, H, W]`` (rounding once)."""
        n, c = out.shape[:2]
        self.steps.append((np.copyto, (out.reshape(n, c, -1),
                                       cols.reshape(c, n, -1).transpose(1, 0, 2))))

    def im2col(self, x: np.ndarray, cols: np.ndarray, n: int) -> None:
        """The step writing im2col of sample ``n`` of ``x`` into ``cols`` (per-sample layout)."""
        kernel = im2col_kernel(use_parallel(cols.size))
        self.steps.append((kernel, (kview(x)[n:n + 1], cols, self.g.window())))

    def columns(self, x: np.ndarray) -> np.ndarray:
        """Batched layout: ``x`` as the whole batch's im2col matrix ``[G*K, N*OHW]``, one step
        (a transposing copy for pointwise convolutions)."""
        if self.g.pointwise:
            return self.to_columns(x)
        cols = self.scratch(self.g.groups * self.g.kg, self.g.n * self.ohw)
        kernel = im2col_kernel(use_parallel(cols.size))
        self.steps.append((kernel, (kview(x), cols, self.g.window())))
        return cols


def _live_weight(w, g):
    """``(steps, w, g)``: where padding hides kernel taps from every output (``live_taps``), a
    step copying the live taps of ``w`` into a scratch weight and the cropped geometry; else no
    step and ``w`` and ``g`` as they are."""
    taps = live_taps(g)
    if taps is None:
        return [], w, g
    p0, p1, q0, q1 = taps
    live = np.empty((g.o, g.cg, p1 - p0, q1 - q0), w.dtype)
    return [(np.copyto, (live, w[:, :, p0:p1, q0:q1]))], live, cropped(g, taps)


def forward_steps(ins, outs, g, attrs):
    """Steps for ``out = conv2d(x, w)``: ``out[n][g] = W[g] @ im2col(x[n])[g]``, or Winograd
    (see the module docstring); only over the kernel taps that reach the input."""
    (x, w), (out,) = ins, outs
    crop, w, g = _live_weight(w, g)
    return crop + algorithm_steps("conv2d", g, [x, w], out, _forward_steps, winograd_fits(g))


def _forward_steps(x, w, out, g, winograd: bool):
    cv = _Conv(g, out.dtype)
    if winograd:
        return winograd_steps(x, cv.widened(w), out, g.ph, g.pw, cv.ct, cv.steps)
    wgs = cv.weight(w)
    if cv.batched:
        prod = cv.scratch(g.o, g.n * cv.ohw)
        cv.gemms(wgs, split(cv.columns(x), g.groups), split(prod, g.groups))
        cv.from_columns(prod, out)
        return cv.steps
    target = cv.target(out)
    t3 = target.reshape(g.n, g.o, cv.ohw)
    x3 = cv.widened(x).reshape(g.n, g.c, cv.ohw) if g.pointwise else None
    cols = None if g.pointwise else cv.scratch(g.groups * g.kg, cv.ohw)
    for n in range(g.n):
        if g.pointwise:
            cols = x3[n]
        else:
            cv.im2col(x, cols, n)
        cv.gemms(wgs, split(cols, g.groups), split(t3[n], g.groups))
    return cv.finish(target, out)


def data_grad_steps(ins, outs, g, attrs):
    """Steps for ``dx = conv_data_grad(dy, w, x_like)``: ``dcols[g] = W[g].T @ dy[n][g]``, then
    col2im into ``dx[n]`` (pointwise: the product is ``dx[n][g]``); Winograd for 3x3 stride 1;
    only over the kernel taps that reach the input."""
    (dy, w, _), (dx,) = ins, outs
    crop, w, g = _live_weight(w, g)
    return crop + algorithm_steps("conv_data_grad", g, [dy, w], dx, _data_grad_steps,
                                  winograd_fits(g) and g.ph <= 2 and g.pw <= 2)


def _data_grad_steps(dy, w, dx, g, winograd: bool):
    cv = _Conv(g, dx.dtype)
    if winograd:
        # a stride-1 3x3 convolution of dy with the flipped, transposed weight, padded 2 - p
        flipped = cv.scratch(g.c, g.o, 3, 3)
        wide = cv.widened(w)
        cv.steps.append((np.copyto, (flipped, wide.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])))
        return winograd_steps(dy, flipped, dx, 2 - g.ph, 2 - g.pw, cv.ct, cv.steps)
    wts = [wg.T for wg in cv.weight(w)]
    if cv.batched:
        dyc = cv.to_columns(dy)
        dcols = cv.scratch(g.groups * g.kg, g.n * cv.ohw)
        cv.gemms(wts, split(dyc, g.groups), split(dcols, g.groups))
        if g.pointwise:
            cv.from_columns(dcols, dx)
            return cv.steps
    else:
        dy3 = cv.widened(dy).reshape(g.n, g.o, cv.ohw)
    if g.pointwise:
        target = cv.target(dx)
        t3 = target.reshape(g.n, g.c, cv.ohw)
        for n in range(g.n):
            cv.gemms(wts, split(dy3[n], g.groups), split(t3[n], g.groups))
        return cv.finish(target, dx)
    narrow = dx.dtype != cv.ct
    dxv = kview(dx).reshape(g.n, g.c, g.h * g.w)
    if cv.batched:       # one col2im over the whole batch
        acc = cv.scratch(g.n, g.c, g.h, g.w) if narrow else dx
        kernel = col2im_kernel(narrow, use_parallel(dx.size))
        cv.steps.append((kernel, (dcols, acc, dxv, g.window())))
        return cv.steps
    acc = cv.scratch(1, g.c, g.h, g.w) if narrow else None
    kernel = col2im_kernel(narrow, use_parallel(g.c * g.h * g.w))
    dcols = cv.scratch(g.groups * g.kg, cv.ohw)
    for n in range(g.n):
        cv.gemms(wts, split(dy3[n], g.groups), split(dcols, g.groups))
        cv.steps.append((kernel, (dcols, acc if narrow else dx[n:n + 1], dxv[n:n + 1],
                                  g.window())))
    return cv.steps


TRANSPOSED_FROM = 1024
"""Terms per product from which a filter gradient's GEMM runs transposed (see
:func:`filter_grad_steps`)."""


def filter_grad_steps(ins, outs, g, attrs):
    """Steps for ``dw = conv_filter_grad(dy, x)``: ``dW[g] = sum_n dy[n][g] @ im2col(x[n])[g].T``
    (batched layout: one product over the whole batch; Winograd for 3x3 stride 1).

    BLAS runs these long-inner-dimension products faster with the larger output side as rows
    (91 against 77 GFLOP/s at 64x256 over 3136), so when ``K > O/G`` and each product sums at
    least ``TRANSPOSED_FROM`` terms the builder computes ``dW[g].T = im2col[g] @ dy[g].T`` into a
    ``[K, O/G]`` scratch and copies it into place once (the transposing copy costs more than it
    saves on shorter sums: 1x1 2048->512 at 7x7, 5.8 against 2.5 ms).

    Kernel taps that never reach the input (``live_taps``) get 0, the others are computed by the
    cropped convolution."""
    (dy, x), (dw,) = ins, outs
    taps = live_taps(g)
    if taps is None:
        return algorithm_steps("conv_filter_grad", g, [dy, x], dw, _filter_grad_steps,
                               winograd_fits(g))
    p0, p1, q0, q1 = taps
    live = np.empty((g.o, g.cg, p1 - p0, q1 - q0), dw.dtype)
    g = cropped(g, taps)
    return (algorithm_steps("conv_filter_grad", g, [dy, x], live, _filter_grad_steps,
                            winograd_fits(g))
            + fill_steps(dw, 0.0) + [(np.copyto, (dw[:, :, p0:p1, q0:q1], live))])


def _filter_grad_steps(dy, x, dw, g, winograd: bool):
    cv = _Conv(g, dw.dtype)
    target = cv.target(dw)
    if winograd:
        winograd_filter_grad_steps(dy, x, target, g.ph, g.pw, cv.ct, cv.steps)
        return cv.finish(target, dw)
    t2 = split(target.reshape(g.o, g.kg), g.groups)
    transposed = g.kg > g.og and (g.n * cv.ohw if cv.batched else cv.ohw) >= TRANSPOSED_FROM
    acc = [cv.scratch(g.kg, g.og) for _ in range(g.groups)] if transposed else t2

    def products(dys, cols, outs_):
        """One product per group: ``dy @ cols.T`` or, transposed, ``cols @ dy.T``."""
        if transposed:
            cv.gemms(cols, [d.T for d in dys], outs_)
        else:
            cv.gemms(dys, [c.T for c in cols], outs_)
    if cv.batched:
        products(split(cv.to_columns(dy), g.groups), split(cv.columns(x), g.groups), acc)
    else:
        dy3 = cv.widened(dy).reshape(g.n, g.o, cv.ohw)
        x3 = cv.widened(x).reshape(g.n, g.c, cv.ohw) if g.pointwise else None
        cols = None if g.pointwise else cv.scratch(g.groups * g.kg, cv.ohw)
        part = [np.empty_like(a) for a in acc]
        for n in range(g.n):
            if g.pointwise:
                cols = x3[n]
            else:
                cv.im2col(x, cols, n)
            products(split(dy3[n], g.groups), split(cols, g.groups), acc if n == 0 else part)
            if n > 0:
                cv.steps += [(np.add, (a, b, a)) for a, b in zip(acc, part)]
    if transposed:
        cv.steps += [(np.copyto, (t, a.T)) for t, a in zip(t2, acc)]
    return cv.finish(target, dw)


def bias_grad_steps(ins, outs, plan, attrs):
    """Steps for ``out[c] = sum_{n, k} dy[n, c, k]`` (``plan``: ``(n, c, hw)``)."""
    (dy,), (out,), (n, c, hw) = ins, outs, plan
    kernel = bias_grad_kernel(use_parallel(dy.size) and c > 1)
    return [(kernel, (kview(dy).reshape(n, c, hw), kview(out)))]


BUILDERS = conv.builders(fill_steps, conv2d=forward_steps, conv_data_grad=data_grad_steps,
                         conv_filter_grad=filter_grad_steps, conv_bias_grad=bias_grad_steps)
"""Op type -> builder of the convolution ops."""
