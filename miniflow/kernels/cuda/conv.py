"""Convolutions on CUDA: ``conv2d``, ``conv_data_grad``, ``conv_filter_grad``,
``conv_bias_grad`` (their builders: ``kernels.common.conv``; these are the step makers).

Convolutions are implicit GEMMs: one tiled kernel (:func:`conv_gemm_kernel`) computes
``out[m, n] = sum_k A(m, k) * B(k, n)`` per group (``blockIdx.z``), where ``A`` and ``B`` are
*index functions* into the real tensors, never materialized (no im2col buffer):

============  ===================  ===================  ===============  =====================
kernel        rows m               columns n            inner k          A / B
============  ===================  ===================  ===============  =====================
forward       (n, oh, ow)          out channel (group)  (c, p, q)        x gather / weight
data grad     (n, h, w) of dx      in channel (group)   (o, p, q)        dy gather / weight
filter grad   (c, p, q) of dW      out channel (group)  (n, oh, ow)      x gather / dy
============  ===================  ===================  ===============  =====================

Each block of ``tile x tile`` threads (``LaunchConfig.conv_tile``: 16 on a GPU) owns one output
tile (``launch.conv_tile_steps``); for every ``tile``-wide slice of K it loads one tile of A and
one of B into shared memory (widened to the compute type; 0 for padding, for positions a strided data gradient never reads, and past the
edges), synchronises, and each thread accumulates its dot product in the compute type (float32
for f16/f32, float64 for f64); one rounding at the store. Threads along ``threadIdx.x`` take
consecutive rows, so the x / dy gathers and the output stores of consecutive ``ow`` are
coalesced. The data gradient as a GEMM over all (o, p, q) wastes the taps a stride skips (3/4 of
them at stride 2) but needs no atomics. The geometry reaches the kernels as one int64 tuple
(:func:`conv_params`). The bias gradient is one block of ``row_block`` threads per channel,
combined in shared memory (``common.block_sum``).

Not tuned on a GPU yet: one output per thread, 16 x 16 tiles, no register blocking, no tensor
cores.
"""
from __future__ import annotations

import functools

from numba import cuda

from ..common import conv
from .common import block_sum, flat, jit, short, types_of
from .launch import conv_tile_steps, current, row_steps
from .movement import fill_steps

__all__ = ["conv_params", "conv_gemm_kernel", "bias_grad_kernel", "forward_steps",
           "data_grad_steps", "filter_grad_steps", "bias_grad_steps", "BUILDERS"]


def conv_params(g) -> tuple:
    """The geometry as the int tuple the convolution kernels take:
    ``(N, C, H, W, O, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, groups)``."""
    return (g.n, g.c, g.h, g.w, g.o, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw,
            g.groups)


# ----------------------------------------------------------------------------- index functions
# Each returns a flat element index, or -1 for a zero (padding / a tap the stride skips).
@cuda.jit(device=True)
def _x_at(geo, grp, n, c, oh, ow, p, q):
    """Index of ``x[n, grp*Cg + c, oh*sh - ph + p*dh, ow*sw - pw + q*dw]`` (-1 in the padding)."""
    nn, cc, h, w, o, ohn, own, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    ih = oh * sh - ph + p * dh
    iw = ow * sw - pw + q * dw
    if ih < 0 or ih >= h or iw < 0 or iw >= w:
        return -1
    return ((n * cc + grp * (cc // groups) + c) * h + ih) * w + iw


@cuda.jit(device=True)
def _fwd_a(geo, grp, m, k):
    """Forward A(m, k): m = (n, oh, ow), k = (c, p, q) -> x."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    n, r = m // (oh * ow), m % (oh * ow)
    return _x_at(geo, grp, n, k // (kh * kw), r // ow, r % ow, (k // kw) % kh, k % kw)


@cuda.jit(device=True)
def _fwd_b(geo, grp, k, j):
    """Forward B(k, j): the weight ``[grp*Og + j, k]`` (weight rows are (c, p, q))."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    return (grp * (o // groups) + j) * (cc // groups * kh * kw) + k


@cuda.jit(device=True)
def _fwd_out(geo, grp, m, j):
    """Forward output ``[n, grp*Og + j, oh, ow]`` with m = (n, oh, ow)."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    n, r = m // (oh * ow), m % (oh * ow)
    return (n * o + grp * (o // groups) + j) * (oh * ow) + r


@cuda.jit(device=True)
def _data_a(geo, grp, m, k):
    """Data-grad A(m, k): m = (n, ih, iw) of dx, k = (j, p, q) ->
    ``dy[n, grp*Og + j, (ih + ph - p*dh) / sh, (iw + pw - q*dw) / sw]`` when both divide and are
    in range, else -1."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    n, r = m // (h * w), m % (h * w)
    j, p, q = k // (kh * kw), (k // kw) % kh, k % kw
    ti = r // w + ph - p * dh
    tj = r % w + pw - q * dw
    if ti < 0 or tj < 0 or ti % sh != 0 or tj % sw != 0:
        return -1
    i, jj = ti // sh, tj // sw
    if i >= oh or jj >= ow:
        return -1
    return ((n * o + grp * (o // groups) + j) * oh + i) * ow + jj


@cuda.jit(device=True)
def _data_b(geo, grp, k, c):
    """Data-grad B(k, c): the weight ``[grp*Og + j, c, p, q]`` with k = (j, p, q)."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    j, pq = k // (kh * kw), k % (kh * kw)
    return ((grp * (o // groups) + j) * (cc // groups) + c) * (kh * kw) + pq


@cuda.jit(device=True)
def _data_out(geo, grp, m, c):
    """Data-grad output ``dx[n, grp*Cg + c, ih, iw]`` with m = (n, ih, iw)."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    n, r = m // (h * w), m % (h * w)
    return (n * cc + grp * (cc // groups) + c) * (h * w) + r


@cuda.jit(device=True)
def _filter_a(geo, grp, m, k):
    """Filter-grad A(m, k): m = (c, p, q) of dW, k = (n, oh, ow) -> x."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    n, r = k // (oh * ow), k % (oh * ow)
    return _x_at(geo, grp, n, m // (kh * kw), r // ow, r % ow, (m // kw) % kh, m % kw)


@cuda.jit(device=True)
def _filter_b(geo, grp, k, j):
    """Filter-grad B(k, j): ``dy[n, grp*Og + j, oh, ow]`` with k = (n, oh, ow)."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    n, r = k // (oh * ow), k % (oh * ow)
    return (n * o + grp * (o // groups) + j) * (oh * ow) + r


@cuda.jit(device=True)
def _filter_out(geo, grp, m, j):
    """Filter-grad output ``dW[grp*Og + j, m]`` (weight rows are (c, p, q))."""
    nn, cc, h, w, o, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups = geo
    return (grp * (o // groups) + j) * (cc // groups * kh * kw) + m


_GEMMS = {"forward": (_fwd_a, _fwd_b, _fwd_out),
          "data_grad": (_data_a, _data_b, _data_out),
          "filter_grad": (_filter_a, _filter_b, _filter_out)}
"""Kernel kind -> its (A index, B index, output index) device functions."""


# ----------------------------------------------------------------------------- convolutions
@functools.cache
def conv_gemm_kernel(kind: str, ld, ct, st, tile: int):
    """``kernel(a, b, out, geo, M, N, K)``: the implicit GEMM ``out = A @ B`` of ``kind``
    (``"forward"``, ``"data_grad"``, ``"filter_grad"``; see the module docstring) for group
    ``blockIdx.z``; ``a``, ``b``, ``out`` are flat, ``geo`` is :func:`conv_params`.

    Block ``(bx, by, g)`` of ``tile x tile`` threads computes rows ``bx*tile + threadIdx.x`` and
    columns ``by*tile + threadIdx.y``; the A tile is loaded with rows along ``threadIdx.x``
    (coalesced gathers), the B tile with k along ``threadIdx.x``.
    """
    a_at, b_at, out_at = _GEMMS[kind]

    @jit
    def kernel(a, b, out, geo, M, N, K):
        sa = cuda.shared.array((tile, tile), ct)      # sa[k, m]
        sb = cuda.shared.array((tile, tile), ct)      # sb[k, n]
        tx, ty, grp = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
        m0, n0 = cuda.blockIdx.x * tile, cuda.blockIdx.y * tile
        acc = ct(0)
        for k0 in range(0, K, tile):
            ia = a_at(geo, grp, m0 + tx, k0 + ty) if m0 + tx < M and k0 + ty < K else -1
            sa[ty, tx] = ld(a[ia]) if ia >= 0 else ct(0)
            ib = b_at(geo, grp, k0 + tx, n0 + ty) if k0 + tx < K and n0 + ty < N else -1
            sb[tx, ty] = ld(b[ib]) if ib >= 0 else ct(0)
            cuda.syncthreads()
            for kk in range(tile):
                acc += sa[kk, tx] * sb[kk, ty]
            cuda.syncthreads()
        if m0 + tx < M and n0 + ty < N:
            out[out_at(geo, grp, m0 + tx, n0 + ty)] = st(acc)

    return kernel


@functools.cache
def bias_grad_kernel(ld, ct, st, block: int):
    """``kernel(dy, out, n, c, hw)``: ``out[c] = sum_{n, k} dy[n, c, k]``, one block per channel."""

    @jit
    def kernel(dy, out, n, c, hw):
        sm = cuda.shared.array(block, ct)
        for ch in range(cuda.blockIdx.x, c, cuda.gridDim.x):
            acc = ct(0)
            for i in range(cuda.threadIdx.x, n * hw, block):
                acc += ld(dy[(i // hw * c + ch) * hw + i % hw])
            total = block_sum(sm, acc)
            if cuda.threadIdx.x == 0:
                out[ch] = st(total)

    return kernel


def _gemm_steps(kind: str, a, b, out, g, m: int, n: int, k: int) -> list:
    """The launch of :func:`conv_gemm_kernel` of ``kind`` over an ``m x n`` output per group."""
    kernel = conv_gemm_kernel(kind, *types_of(out), current().conv_tile)
    return conv_tile_steps(kernel, m, n, g.groups,
                           (flat(a), flat(b), flat(out), conv_params(g), m, n, k),
                           f"conv2d_{kind} {short(out.dtype)}")


def forward_steps(ins, outs, g, attrs):
    """``out = conv2d(x, w)``: implicit GEMM over (n, oh, ow) x (out channels)."""
    (x, w), (out,) = ins, outs
    return _gemm_steps("forward", x, w, out, g, g.n * g.oh * g.ow, g.og, g.kg)


def data_grad_steps(ins, outs, g, attrs):
    """``dx = conv_data_grad(dy, w, x_like)``: implicit GEMM over (n, h, w) x (in channels)."""
    (dy, w, _), (dx,) = ins, outs
    return _gemm_steps("data_grad", dy, w, dx, g, g.n * g.h * g.w, g.cg, g.og * g.kh * g.kw)


def filter_grad_steps(ins, outs, g, attrs):
    """``dw = conv_filter_grad(dy, x)``: implicit GEMM over (c, p, q) x (out channels), summed
    over (n, oh, ow)."""
    (dy, x), (dw,) = ins, outs
    return _gemm_steps("filter_grad", x, dy, dw, g, g.kg, g.og, g.n * g.oh * g.ow)


def bias_grad_steps(ins, outs, plan, attrs):
    """``out[c] = sum dy[n, c, hw]`` (``plan``: ``(n, c, hw)``): one row block per channel."""
    (dy,), (out,), (n, c, hw) = ins, outs, plan
    kernel = bias_grad_kernel(*types_of(out), current().row_block)
    return row_steps(kernel, c, (flat(dy), flat(out), n, c, hw),
                     f"conv_bias_grad {short(out.dtype)}")


BUILDERS = conv.builders(fill_steps, conv2d=forward_steps, conv_data_grad=data_grad_steps,
                         conv_filter_grad=filter_grad_steps, conv_bias_grad=bias_grad_steps)
"""Op type -> builder of the convolution ops."""
