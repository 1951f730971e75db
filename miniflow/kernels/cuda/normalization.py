"""Batch norm on CUDA: ``normalization`` (training and eval), ``normalization_grad`` and
``increment`` (their builders: ``kernels.common.normalization``; these are the step makers).

Training and the gradient run one block of ``row_block`` threads per channel, combined in shared
memory (``common.block_sum``): two passes for the statistics (the mean, then the squared
deviations from it), thread 0 writes the statistics and the moving statistics, then every thread
writes its share of ``y`` (or ``dx``). Eval is a grid-stride loop over ``x``. Statistics and
parameters are in the compute type (float32 for f16/f32 ``x``, OneFlow's parameter dtype), or
for a half ``x`` all four of its own dtype: loaded widened, the moving statistics and the
parameter gradients stored rounded once (``types_of`` of the vectors).

Layer norm (``layer_norm``, ``layer_norm_grad``) runs one block per row of ``x`` viewed as
``[rows, cols]``, the same two-pass block sums; ``layer_norm_param_grad`` is a grid-stride loop
over the columns, each thread summing its column over the rows (no atomics).
"""
from __future__ import annotations

import functools

from numba import cuda

from ..common import normalization
from ..common.normalization import by_mode, param
from .common import block_sum, flat, jit, math, short, types_of
from .launch import current, flat_steps, row_steps

__all__ = ["norm_train_kernel", "norm_eval_kernel", "norm_grad_kernel", "increment_kernel",
           "layer_norm_kernel", "layer_norm_grad_kernel", "layer_norm_param_grad_kernel",
           "train_steps", "eval_steps", "grad_steps", "increment_steps", "layer_norm_steps",
           "layer_norm_grad_steps", "layer_norm_param_grad_steps", "BUILDERS"]


@cuda.jit(device=True)
def _channel_index(i, ch, c, inner):
    """Flat index of the ``i``-th element of channel ``ch`` in ``[outer, C, inner]``."""
    return (i // inner * c + ch) * inner + i % inner


@functools.cache
def norm_train_kernel(ld, ct, st, pld, pst, block: int):
    """``kernel(x, y, mean, inv_var, moving_mean, moving_var, gamma, beta, outer, c, inner, eps,
    momentum)``: training batch norm, one block per channel: the mean, then the squared
    deviations from it (two block sums), ``inv_var = 1 / sqrt(var + eps)``, the moving
    statistics (thread 0; the variance unbiased), then ``y = (x - mean) * gamma * inv_var + beta``.
    ``mean`` / ``inv_var`` are in the compute type ``ct``; the moving statistics, gamma and beta
    are loaded with ``pld`` and stored with ``pst`` (their dtype's: float32, or x's half type)."""

    @jit
    def kernel(x, y, mean, inv_var, moving_mean, moving_var, gamma, beta, outer, c, inner, eps,
               momentum):
        sm = cuda.shared.array(block, ct)
        m = outer * inner
        for ch in range(cuda.blockIdx.x, c, cuda.gridDim.x):
            s = ct(0)
            for i in range(cuda.threadIdx.x, m, block):
                s += ld(x[_channel_index(i, ch, c, inner)])
            mu = ct(block_sum(sm, s) / ct(m))
            s = ct(0)
            for i in range(cuda.threadIdx.x, m, block):
                d = ld(x[_channel_index(i, ch, c, inner)]) - mu
                s += d * d
            s2 = block_sum(sm, s)
            inv = ct(ct(1) / math.sqrt(ct(s2 / ct(m)) + ct(eps)))
            if cuda.threadIdx.x == 0:
                k = ct(momentum)
                mean[ch], inv_var[ch] = mu, inv
                moving_mean[ch] = pst(ct(k * pld(moving_mean[ch]) + (ct(1) - k) * mu))
                moving_var[ch] = pst(ct(k * pld(moving_var[ch])
                                        + (ct(1) - k) * ct(s2 / ct(m - 1))))
            scale, shift = ct(pld(gamma[ch]) * inv), pld(beta[ch])
            for i in range(cuda.threadIdx.x, m, block):
                j = _channel_index(i, ch, c, inner)
                y[j] = st((ld(x[j]) - mu) * scale + shift)

    return kernel


@functools.cache
def norm_eval_kernel(ld, ct, st, pld):
    """``kernel(x, y, moving_mean, moving_var, gamma, beta, c, inner, eps)``, flat over x:
    ``y = (x - moving_mean) * gamma / sqrt(moving_var + eps) + beta`` of its channel (the four
    vectors loaded with ``pld``)."""

    @jit
    def kernel(x, y, moving_mean, moving_var, gamma, beta, c, inner, eps):
        for i in range(cuda.grid(1), y.size, cuda.gridsize(1)):
            ch = i // inner % c
            scale = ct(pld(gamma[ch]) / math.sqrt(pld(moving_var[ch]) + ct(eps)))
            y[i] = st((ld(x[i]) - pld(moving_mean[ch])) * scale + pld(beta[ch]))

    return kernel


@functools.cache
def norm_grad_kernel(ld, ct, st, pld, pst, block: int):
    """``kernel(x, dy, mean, inv_var, gamma, gamma_diff, beta_diff, dx, outer, c, inner)``, one
    block per channel: ``beta_diff = sum(dy)``, ``gamma_diff = sum(dy * xhat)``, then
    ``dx = gamma * inv_var * (dy - beta_diff / M - xhat * gamma_diff / M)``. ``gamma`` is loaded
    with ``pld``, ``gamma_diff`` / ``beta_diff`` stored with ``pst`` (gamma's dtype)."""

    @jit
    def kernel(x, dy, mean, inv_var, gamma, gamma_diff, beta_diff, dx, outer, c, inner):
        sm = cuda.shared.array(block, ct)
        m = outer * inner
        for ch in range(cuda.blockIdx.x, c, cuda.gridDim.x):
            mu, iv = mean[ch], inv_var[ch]
            pdy, pdx = ct(0), ct(0)
            for i in range(cuda.threadIdx.x, m, block):
                j = _channel_index(i, ch, c, inner)
                d = ld(dy[j])
                pdy += d
                pdx += d * (ld(x[j]) - mu)
            sdy = block_sum(sm, pdy)
            sdx = ct(block_sum(sm, pdx) * iv)
            if cuda.threadIdx.x == 0:
                beta_diff[ch], gamma_diff[ch] = pst(sdy), pst(sdx)
            a, mdy, mdx = ct(pld(gamma[ch]) * iv), ct(sdy / ct(m)), ct(sdx / ct(m) * iv)
            for i in range(cuda.threadIdx.x, m, block):
                j = _channel_index(i, ch, c, inner)
                dx[j] = st(a * (ld(dy[j]) - mdy - (ld(x[j]) - mu) * mdx))

    return kernel


@functools.cache
def increment_kernel():
    """``kernel(counter)``: ``counter[0] += 1`` (one thread; a flat int64 view)."""

    @jit
    def kernel(counter):
        if cuda.grid(1) == 0:
            counter[0] += 1

    return kernel


@functools.cache
def layer_norm_kernel(ld, ct, st, block: int, affine: bool):
    """``kernel(x, gamma, beta, y, mean, inv_var, rows, cols, eps)``: one block per row of ``x``
    viewed as ``[rows, cols]``: the mean, then the squared deviations from it (two block sums),
    thread 0 writes ``mean`` and ``inv_var = 1 / sqrt(var + eps)``, every thread its share of
    ``y = (x - mean) * inv_var`` (``* gamma + beta`` when ``affine``)."""

    @jit
    def kernel(x, gamma, beta, y, mean, inv_var, rows, cols, eps):
        sm = cuda.shared.array(block, ct)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = r * cols
            s = ct(0)
            for i in range(cuda.threadIdx.x, cols, block):
                s += ld(x[base + i])
            mu = ct(block_sum(sm, s) / ct(cols))
            s = ct(0)
            for i in range(cuda.threadIdx.x, cols, block):
                d = ld(x[base + i]) - mu
                s += d * d
            s2 = block_sum(sm, s)
            iv = ct(ct(1) / math.sqrt(ct(s2 / ct(cols)) + ct(eps)))
            if cuda.threadIdx.x == 0:
                mean[r], inv_var[r] = mu, iv
            for i in range(cuda.threadIdx.x, cols, block):
                v = ct((ld(x[base + i]) - mu) * iv)
                if affine:
                    v = ct(v * ld(gamma[i]) + ld(beta[i]))
                y[base + i] = st(v)

    return kernel


@functools.cache
def layer_norm_grad_kernel(ld, ct, st, block: int, affine: bool):
    """``kernel(dy, x, mean, inv_var, gamma, dx, rows, cols)``: one block per row, with
    ``g = dy * gamma`` (``dy`` without ``affine``) and ``xhat = (x - mean) * inv_var``:
    ``dx = inv_var * (g - sum(g) / cols - xhat * sum(g * xhat) / cols)``."""

    @jit
    def kernel(dy, x, mean, inv_var, gamma, dx, rows, cols):
        sm = cuda.shared.array(block, ct)
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            base = r * cols
            mu, iv = mean[r], inv_var[r]
            pg, pgx = ct(0), ct(0)
            for i in range(cuda.threadIdx.x, cols, block):
                g = ld(dy[base + i])
                if affine:
                    g = ct(g * ld(gamma[i]))
                pg += g
                pgx += ct(g * ((ld(x[base + i]) - mu) * iv))
            mg = ct(block_sum(sm, pg) / ct(cols))
            mgx = ct(block_sum(sm, pgx) / ct(cols))
            for i in range(cuda.threadIdx.x, cols, block):
                g = ld(dy[base + i])
                if affine:
                    g = ct(g * ld(gamma[i]))
                dx[base + i] = st(iv * (g - mg - (ld(x[base + i]) - mu) * iv * mgx))

    return kernel


@functools.cache
def layer_norm_param_grad_kernel(ld, ct, st):
    """``kernel(dy, x, mean, inv_var, gamma_diff, beta_diff, rows, cols)``, grid-stride over the
    columns: ``gamma_diff = sum over rows of dy * (x - mean) * inv_var``, ``beta_diff = sum over
    rows of dy``."""

    @jit
    def kernel(dy, x, mean, inv_var, gamma_diff, beta_diff, rows, cols):
        for c in range(cuda.grid(1), cols, cuda.gridsize(1)):
            sg, sb = ct(0), ct(0)
            for r in range(rows):
                d = ld(dy[r * cols + c])
                sb += d
                sg += ct(d * ((ld(x[r * cols + c]) - mean[r]) * inv_var[r]))
            gamma_diff[c] = st(sg)
            beta_diff[c] = st(sb)

    return kernel


def layer_norm_steps(ins, outs, plan, attrs):
    """Row launches of :func:`layer_norm_kernel`, one block per row."""
    x, gamma, beta, (y, mean, inv), (rows, cols) = ins[0], param(ins, 1), param(ins, 2), outs, plan
    eps = attrs["epsilon"]
    affine = gamma is not None
    kernel = layer_norm_kernel(*types_of(x), current().row_block, affine)
    g, b = (flat(gamma), flat(beta)) if affine else (flat(x), flat(x))
    return row_steps(kernel, rows, (flat(x), g, b, flat(y), flat(mean), flat(inv), rows, cols,
                                    float(eps)), f"layer_norm {short(x.dtype)}")


def layer_norm_grad_steps(ins, outs, plan, attrs):
    """Row launches of :func:`layer_norm_grad_kernel`, one block per row."""
    (dy, x, mean, inv), gamma, (dx,), (rows, cols) = ins[:4], param(ins, 4), outs, plan
    affine = gamma is not None
    kernel = layer_norm_grad_kernel(*types_of(x), current().row_block, affine)
    return row_steps(kernel, rows, (flat(dy), flat(x), flat(mean), flat(inv),
                                    flat(gamma) if affine else flat(x), flat(dx), rows, cols),
                     f"layer_norm_grad {short(x.dtype)}")


def layer_norm_param_grad_steps(ins, outs, plan, attrs):
    """A grid-stride launch of :func:`layer_norm_param_grad_kernel` over the columns."""
    (dy, x, mean, inv), (gamma_diff, beta_diff), (rows, cols) = ins, outs, plan
    return flat_steps(layer_norm_param_grad_kernel(*types_of(dy)), cols,
                      (flat(dy), flat(x), flat(mean), flat(inv), flat(gamma_diff),
                       flat(beta_diff), rows, cols), f"layer_norm_param_grad {short(dy.dtype)}")


def train_steps(ins, outs, layout, attrs):
    """Row launches of :func:`norm_train_kernel`, one block per channel."""
    (x, mm, mv, gamma, beta), (y, mean, inv), (outer, c, inner) = ins, outs, layout
    eps, momentum = attrs["epsilon"], attrs["momentum"]
    pld, _, pst = types_of(mm)
    kernel = norm_train_kernel(*types_of(x), pld, pst, current().row_block)
    return row_steps(kernel, c, (flat(x), flat(y), mean, inv, flat(mm), flat(mv), flat(gamma),
                                 flat(beta), outer, c, inner, float(eps), float(momentum)),
                     f"normalization {short(x.dtype)}")


def eval_steps(ins, outs, layout, attrs):
    """A grid-stride launch of :func:`norm_eval_kernel` over ``x``."""
    (x, mm, mv, gamma, beta), y, (_, c, inner) = ins, outs[0], layout
    eps = attrs["epsilon"]
    return flat_steps(norm_eval_kernel(*types_of(x), types_of(mm)[0]), x.size,
                      (flat(x), flat(y), flat(mm), flat(mv), flat(gamma), flat(beta), c, inner,
                       float(eps)),
                      f"normalization_eval {short(x.dtype)}")


def grad_steps(ins, outs, layout, attrs):
    """Row launches of :func:`norm_grad_kernel`, one block per channel."""
    (x, dy, mean, inv, gamma), (gamma_diff, beta_diff, dx), (outer, c, inner) = ins, outs, layout
    pld, _, pst = types_of(gamma)
    kernel = norm_grad_kernel(*types_of(x), pld, pst, current().row_block)
    return row_steps(kernel, c, (flat(x), flat(dy), mean, inv, flat(gamma), flat(gamma_diff),
                                 flat(beta_diff), flat(dx), outer, c, inner),
                     f"normalization_grad {short(x.dtype)}")


def increment_steps(ins, outs, plan, attrs):
    """One single-thread launch of :func:`increment_kernel` (``counter += 1`` in place)."""
    return flat_steps(increment_kernel(), 1, (flat(ins[0]),), "increment i64")


BUILDERS = normalization.builders(normalization=by_mode(train_steps, eval_steps),
                                  normalization_grad=grad_steps, increment=increment_steps,
                                  layer_norm=layer_norm_steps,
                                  layer_norm_grad=layer_norm_grad_steps,
                                  layer_norm_param_grad=layer_norm_param_grad_steps)
"""Op type -> builder of the batch-norm and layer-norm ops."""
