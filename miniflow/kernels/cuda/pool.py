"""Pooling on CUDA: ``max_pool_2d``, ``avg_pool_2d``, ``adaptive_avg_pool2d`` and their
gradients (their builders: ``kernels.common.pool``; these are the step makers). Grid-stride loops
over the outputs (``launch.flat_steps``); the gradients gather, each ``dx`` element summing the
windows that contain it (max pool: those whose ``indice`` names it), so no kernel uses atomics.
A window's max scans its taps in PyTorch's order (rows, then columns) with ``val > max ||
isnan(val)``, as the CPU kernel's associative rule gives.
"""
from __future__ import annotations

import functools

from numba import cuda

from ..common import pool
from .common import flat, jit, math, short, types_of
from .launch import flat_steps

__all__ = ["max_pool_kernel", "max_pool_grad_kernel", "avg_pool_kernel", "avg_pool_grad_kernel",
           "adaptive_avg_pool_kernel", "adaptive_avg_pool_grad_kernel", "BUILDERS"]


@functools.cache
def max_pool_kernel(ld, ct, st):
    """``kernel(x, y, indice, window)``, flat over y: each window's max (padding ``-inf``) and
    the flat ``ih * W + iw`` of its first maximum (a NaN wins); ``-inf`` and -1 for a window
    outside the input."""

    @jit
    def kernel(x, y, indice, window):
        h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = window
        for t in range(cuda.grid(1), y.size, cuda.gridsize(1)):
            pl, r = t // (oh * ow), t % (oh * ow)
            i, j = r // ow, r % ow
            best, at = ct(-math.inf), -1
            for p in range(kh):
                ih = i * sh - ph + p * dh
                for q in range(kw):
                    iw = j * sw - pw + q * dw
                    if 0 <= ih < h and 0 <= iw < w:
                        v = ld(x[pl * h * w + ih * w + iw])
                        if at < 0 or v > best or v != v:
                            best, at = v, ih * w + iw
            y[t] = st(best)
            indice[t] = at

    return kernel


@functools.cache
def max_pool_grad_kernel(ld, ct, st):
    """``kernel(indice, dy, dx, window)``, flat over dx: the sum of the ``dy`` of every window
    containing the element whose index names it (a gather: no atomics)."""

    @jit
    def kernel(indice, dy, dx, window):
        h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = window
        for t in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
            pl, r = t // (h * w), t % (h * w)
            ih, iw = r // w, r % w
            acc = ct(0)
            for p in range(kh):
                ti = ih + ph - p * dh
                if ti >= 0 and ti % sh == 0 and ti // sh < oh:
                    for q in range(kw):
                        tj = iw + pw - q * dw
                        if tj >= 0 and tj % sw == 0 and tj // sw < ow:
                            k = pl * oh * ow + (ti // sh) * ow + tj // sw
                            if indice[k] == r:
                                acc += ld(dy[k])
            dx[t] = st(acc)

    return kernel


@cuda.jit(device=True)
def _avg_divisor(i, j, window, count_include_pad, divisor_override):
    """The divisor of output ``(i, j)`` of an average pool (PyTorch's rule)."""
    h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = window
    if divisor_override > 0:
        return divisor_override
    hs, ws = i * sh - ph, j * sw - pw
    he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
    if count_include_pad:
        return (he - hs) * (we - ws)
    return (min(he, h) - max(hs, 0)) * (min(we, w) - max(ws, 0))


@functools.cache
def avg_pool_kernel(ld, ct, st):
    """``kernel(x, y, window, count_include_pad, divisor_override)``, flat over y: each window's
    sum over the input divided by its divisor."""

    @jit
    def kernel(x, y, window, count_include_pad, divisor_override):
        h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = window
        for t in range(cuda.grid(1), y.size, cuda.gridsize(1)):
            pl, r = t // (oh * ow), t % (oh * ow)
            i, j = r // ow, r % ow
            acc = ct(0)
            for ih in range(max(i * sh - ph, 0), min(i * sh - ph + kh, h)):
                for iw in range(max(j * sw - pw, 0), min(j * sw - pw + kw, w)):
                    acc += ld(x[pl * h * w + ih * w + iw])
            div = _avg_divisor(i, j, window, count_include_pad, divisor_override)
            y[t] = st(acc / ct(div))

    return kernel


@functools.cache
def avg_pool_grad_kernel(ld, ct, st):
    """``kernel(dy, dx, window, count_include_pad, divisor_override)``, flat over dx: the sum of
    ``dy / divisor`` over the windows containing the element."""

    @jit
    def kernel(dy, dx, window, count_include_pad, divisor_override):
        h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw = window
        for t in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
            pl, r = t // (h * w), t % (h * w)
            ih, iw = r // w, r % w
            acc = ct(0)
            for i in range(max(0, (ih + ph - kh + sh) // sh), min(oh, (ih + ph) // sh + 1)):
                for j in range(max(0, (iw + pw - kw + sw) // sw), min(ow, (iw + pw) // sw + 1)):
                    div = _avg_divisor(i, j, window, count_include_pad, divisor_override)
                    acc += ld(dy[pl * oh * ow + i * ow + j]) / ct(div)
            dx[t] = st(acc)

    return kernel


@functools.cache
def adaptive_avg_pool_kernel(ld, ct, st):
    """``kernel(x, y, h, w, oh, ow)``, flat over y: the mean of the adaptive window
    ``[floor(i*H/OH), ceil((i+1)*H/OH)) x [floor(j*W/OW), ceil((j+1)*W/OW))``."""

    @jit
    def kernel(x, y, h, w, oh, ow):
        for t in range(cuda.grid(1), y.size, cuda.gridsize(1)):
            pl, r = t // (oh * ow), t % (oh * ow)
            i, j = r // ow, r % ow
            h0, h1 = (i * h) // oh, ((i + 1) * h + oh - 1) // oh
            w0, w1 = (j * w) // ow, ((j + 1) * w + ow - 1) // ow
            acc = ct(0)
            for ih in range(h0, h1):
                for iw in range(w0, w1):
                    acc += ld(x[pl * h * w + ih * w + iw])
            y[t] = st(acc / ct((h1 - h0) * (w1 - w0)))

    return kernel


@functools.cache
def adaptive_avg_pool_grad_kernel(ld, ct, st):
    """``kernel(dy, dx, h, w, oh, ow)``, flat over dx: the sum of ``dy / area`` over the adaptive
    windows containing the element (``i`` in ``[floor(ih*OH/H), ((ih+1)*OH - 1) // H]``)."""

    @jit
    def kernel(dy, dx, h, w, oh, ow):
        for t in range(cuda.grid(1), dx.size, cuda.gridsize(1)):
            pl, r = t // (h * w), t % (h * w)
            ih, iw = r // w, r % w
            acc = ct(0)
            for i in range((ih * oh) // h, ((ih + 1) * oh - 1) // h + 1):
                hn = ((i + 1) * h + oh - 1) // oh - (i * h) // oh
                for j in range((iw * ow) // w, ((iw + 1) * ow - 1) // w + 1):
                    wn = ((j + 1) * w + ow - 1) // ow - (j * w) // ow
                    acc += ld(dy[pl * oh * ow + i * ow + j]) / ct(hn * wn)
            dx[t] = st(acc)

    return kernel


def max_steps(ins, outs, g, attrs):
    """A grid-stride launch of :func:`max_pool_kernel` over ``y``."""
    (x,), (y, ind) = ins, outs
    return flat_steps(max_pool_kernel(*types_of(y)), y.size,
                      (flat(x), flat(y), flat(ind), g.window()), f"max_pool_2d {short(y.dtype)}")


def max_grad_steps(ins, outs, g, attrs):
    """A grid-stride launch of :func:`max_pool_grad_kernel` over ``dx``."""
    (_, ind, dy), (dx,) = ins, outs
    return flat_steps(max_pool_grad_kernel(*types_of(dx)), dx.size,
                      (flat(ind), flat(dy), flat(dx), g.window()),
                      f"max_pool_2d_grad {short(dx.dtype)}")


def avg_steps(ins, outs, g, attrs):
    """A grid-stride launch of :func:`avg_pool_kernel` over ``y``."""
    (x,), (y,) = ins, outs
    return flat_steps(avg_pool_kernel(*types_of(y)), y.size,
                      (flat(x), flat(y), g.window(), attrs["count_include_pad"],
                       attrs["divisor_override"]), f"avg_pool_2d {short(y.dtype)}")


def avg_grad_steps(ins, outs, g, attrs):
    """A grid-stride launch of :func:`avg_pool_grad_kernel` over ``dx``."""
    (_, dy), (dx,) = ins, outs
    return flat_steps(avg_pool_grad_kernel(*types_of(dx)), dx.size,
                      (flat(dy), flat(dx), g.window(), attrs["count_include_pad"],
                       attrs["divisor_override"]), f"avg_pool_2d_grad {short(dx.dtype)}")


def adaptive_steps(ins, outs, size, attrs):
    """A grid-stride launch of :func:`adaptive_avg_pool_kernel` over ``y``."""
    (x,), (y,), (oh, ow) = ins, outs, size
    h, w = tuple(x.shape)[2:]
    return flat_steps(adaptive_avg_pool_kernel(*types_of(y)), y.size,
                      (flat(x), flat(y), h, w, oh, ow), f"adaptive_avg_pool2d {short(y.dtype)}")


def adaptive_grad_steps(ins, outs, size, attrs):
    """A grid-stride launch of :func:`adaptive_avg_pool_grad_kernel` over ``dx``."""
    (_, dy), (dx,), (oh, ow) = ins, outs, size
    h, w = tuple(dx.shape)[2:]
    return flat_steps(adaptive_avg_pool_grad_kernel(*types_of(dx)), dx.size,
                      (flat(dy), flat(dx), h, w, oh, ow),
                      f"adaptive_avg_pool2d_grad {short(dx.dtype)}")


BUILDERS = pool.builders(max_pool_2d=max_steps, max_pool_2d_grad=max_grad_steps,
                         avg_pool_2d=avg_steps, avg_pool_2d_grad=avg_grad_steps,
                         adaptive_avg_pool2d=adaptive_steps,
                         adaptive_avg_pool2d_grad=adaptive_grad_steps)
"""Op type -> builder of the pooling ops (the pool family on CUDA)."""
