"""Batch norm on the CPU: ``normalization`` (training and eval), ``normalization_grad`` and
``increment`` (their builders: ``kernels.common.normalization``; these are the step makers), and
layer norm: ``layer_norm``, ``layer_norm_grad``, ``layer_norm_param_grad`` (the same step makers,
builders in ``kernels.common.normalization`` too).

One kernel per op, one channel per (parallel) iteration. Training computes the channel's mean
first, then the sum of squared deviations from it: two passes over data that stays in cache,
exact up to rounding for any mean (one-pass ``E[x^2] - E[x]^2`` in float32 loses the variance of
float16 data at mean 1000 and std 1 to cancellation), then the normalized output; it writes
``mean``, ``inv_variance`` and the moving statistics in place. The gradient sums ``dy`` and
``dy * (x - mean)`` in one pass, then writes ``dx``. Statistics and parameters are in the
parameter dtype (float32 for float16 ``x``, OneFlow's), or for a half ``x`` the moving statistics,
gamma and beta (and so the parameter gradients) in ``x``'s own dtype (PyTorch's half batch
norm); ``mean`` / ``inv_variance`` and all arithmetic stay float32. Half arrays are widened on
load and rounded once on store (``load`` / ``store``).
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..common import normalization
from ..common.normalization import by_mode, param
from .common import flat, jit, loop_for, use_parallel
from .fp16 import load, store, to_compute

__all__ = ["norm_train_kernel", "norm_eval_kernel", "norm_grad_kernel", "increment_kernel",
           "layer_norm_kernel", "layer_norm_grad_kernel", "layer_norm_param_grad_kernel",
           "train_steps", "eval_steps", "grad_steps", "increment_steps", "layer_norm_steps",
           "layer_norm_grad_steps", "layer_norm_param_grad_steps", "BUILDERS"]


@functools.cache
def norm_train_kernel(parallel: bool):
    """``kernel(x, y, mean, inv_var, moving_mean, moving_var, gamma, beta, outer, inner, eps,
    momentum)``: training-mode batch norm of ``x`` viewed as ``[outer, C, inner]`` (flat kernel
    views), one channel per (parallel) iteration: the mean, then the sum of squared deviations
    from it, ``inv_var = 1 / sqrt(var + eps)``, the moving statistics updated in place
    (``momentum * old + (1 - momentum) * batch``, the variance unbiased), and
    ``y = (x - mean) * (gamma * inv_var) + beta``. Computed in the parameters' dtype.

    The parallel variant's element indices are unsigned: a signed index is checked for
    wraparound (a negative index counts from the end) at every load, and where LLVM could not
    prove the channel's offset non-negative (the ``prange`` variant) that check kept the loops
    from vectorizing: the parallel kernel ran 3x slower per element than the serial one and
    gained nothing on 2 threads (one core of the Intel machine, ``[2, 64, 112, 112]``: 2.1
    against 0.7 ms; with unsigned indices 0.36-0.39 on 2 threads; the same bits). The serial
    variant keeps signed indices: unsigned ones made it 15-30% slower (``[16, 64, 56, 56]``,
    one thread, CPU time at load 10-12: 3.1-4.3 against 4.7-5.1 ms forward, 4.9-5.7 against
    6.3-6.4 gradient)."""
    loop = loop_for(parallel)
    index = np.uint64 if parallel else np.int64

    @jit(parallel, fastmath=("reassoc",))
    def kernel(x, y, mean, inv_var, moving_mean, moving_var, gamma, beta, outer, inner, eps,
               momentum):
        c_n = mean.size
        m = to_compute(mean, outer * inner)
        one = to_compute(mean, 1.0)
        k = to_compute(mean, momentum)
        for c_ in loop(c_n):
            c = np.int64(c_)
            s = to_compute(mean, 0.0)
            for o in range(outer):
                base, part = index((o * c_n + c) * inner), to_compute(mean, 0.0)
                for i in range(inner):
                    part += load(x, base + index(i))
                s += part
            mu = s / m
            s2 = to_compute(mean, 0.0)
            for o in range(outer):
                base, part = index((o * c_n + c) * inner), to_compute(mean, 0.0)
                for i in range(inner):
                    d = load(x, base + index(i)) - mu
                    part += d * d
                s2 += part
            inv = one / math.sqrt(s2 / m + to_compute(mean, eps))
            mean[c], inv_var[c] = mu, inv
            store(moving_mean, c, k * load(moving_mean, c) + (one - k) * mu)
            store(moving_var, c, k * load(moving_var, c) + (one - k) * (s2 / (m - one)))
            scale, shift = load(gamma, c) * inv, load(beta, c)
            for o in range(outer):
                base = index((o * c_n + c) * inner)
                for i in range(inner):
                    j = base + index(i)
                    store(y, j, (load(x, j) - mu) * scale + shift)

    return kernel


@functools.cache
def norm_eval_kernel(parallel: bool):
    """``kernel(x, y, moving_mean, moving_var, gamma, beta, outer, inner, eps)``:
    ``y = (x - moving_mean) * (gamma / sqrt(moving_var + eps)) + beta`` per channel, one
    ``(outer, channel)`` row per (parallel) iteration."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(x, y, moving_mean, moving_var, gamma, beta, outer, inner, eps):
        c_n = gamma.size
        for r_ in loop(outer * c_n):
            r = np.int64(r_)
            c = r % c_n
            mu = load(moving_mean, c)
            scale = load(gamma, c) / math.sqrt(load(moving_var, c) + to_compute(gamma, eps))
            shift = load(beta, c)
            for i in range(r * inner, (r + 1) * inner):
                store(y, i, (load(x, i) - mu) * scale + shift)

    return kernel


@functools.cache
def norm_grad_kernel(parallel: bool):
    """``kernel(x, dy, mean, inv_var, gamma, gamma_diff, beta_diff, dx, outer, inner)``: per
    channel ``beta_diff = sum(dy)``, ``gamma_diff = sum(dy * xhat)`` with
    ``xhat = (x - mean) * inv_var``, then
    ``dx = gamma * inv_var * (dy - beta_diff / M - xhat * gamma_diff / M)``. The parallel
    variant's element indices are unsigned, as :func:`norm_train_kernel`'s."""
    loop = loop_for(parallel)
    index = np.uint64 if parallel else np.int64

    @jit(parallel, fastmath=("reassoc",))
    def kernel(x, dy, mean, inv_var, gamma, gamma_diff, beta_diff, dx, outer, inner):
        c_n = mean.size
        m = to_compute(mean, outer * inner)
        for c_ in loop(c_n):
            c = np.int64(c_)
            mu, iv = mean[c], inv_var[c]
            sdy, sdx = to_compute(mean, 0.0), to_compute(mean, 0.0)
            for o in range(outer):
                base = index((o * c_n + c) * inner)
                pdy, pdx = to_compute(mean, 0.0), to_compute(mean, 0.0)
                for i in range(inner):
                    d = load(dy, base + index(i))
                    pdy += d
                    pdx += d * (load(x, base + index(i)) - mu)
                sdy += pdy
                sdx += pdx
            sdx *= iv
            store(beta_diff, c, sdy)
            store(gamma_diff, c, sdx)
            a, mdy, mdx = load(gamma, c) * iv, sdy / m, sdx / m * iv
            for o in range(outer):
                base = index((o * c_n + c) * inner)
                for i in range(inner):
                    j = base + index(i)
                    store(dx, j, a * (load(dy, j) - mdy - (load(x, j) - mu) * mdx))

    return kernel


@functools.cache
def increment_kernel():
    """``kernel(counter)``: ``counter[0] += 1`` (a flat int64 view)."""

    @jit(False)
    def kernel(counter):
        counter[0] += 1

    return kernel


@functools.cache
def layer_norm_kernel(parallel: bool, affine: bool):
    """``kernel(x, gamma, beta, y, mean, inv_var, rows, cols, eps)``: layer norm of ``x`` viewed
    as ``[rows, cols]``, one row per (parallel) iteration: the row's mean, then the sum of squared
    deviations from it (two passes: no cancellation at any mean), ``inv_var = 1 / sqrt(var +
    eps)``, ``y = (x - mean) * inv_var`` (``* gamma + beta`` when ``affine``). Statistics in their
    own dtype (float32 for half ``x``), the row in the compute type. Element offsets are unsigned,
    for the reason :func:`norm_train_kernel` gives: with signed ones the parallel variant's row
    loops stayed scalar ([1024, 128] float32 on one AMD Zen 4 core: 265 us, serial 31 us; now
    the same 31 us, and 17 us on two threads; gradient 158 -> 18 us on two)."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("reassoc",))
    def kernel(x, gamma, beta, y, mean, inv_var, rows, cols, eps):
        n = to_compute(mean, cols)
        one = to_compute(mean, 1.0)
        ucols = np.uint64(cols)
        for r_ in loop(rows):
            base = np.uint64(r_) * ucols
            s = to_compute(mean, 0.0)
            for i in range(ucols):
                s += load(x, base + i)
            mu = s / n
            s2 = to_compute(mean, 0.0)
            for i in range(ucols):
                d = load(x, base + i) - mu
                s2 += d * d
            iv = one / math.sqrt(s2 / n + to_compute(mean, eps))
            mean[r_], inv_var[r_] = mu, iv
            for i in range(ucols):
                v = (load(x, base + i) - mu) * iv
                if affine:
                    v = v * load(gamma, i) + load(beta, i)
                store(y, base + i, v)

    return kernel


@functools.cache
def layer_norm_grad_kernel(parallel: bool, affine: bool):
    """``kernel(dy, x, mean, inv_var, gamma, dx, rows, cols)``: per row, with ``g = dy * gamma``
    (``dy`` without ``affine``) and ``xhat = (x - mean) * inv_var``,
    ``dx = inv_var * (g - sum(g) / cols - xhat * sum(g * xhat) / cols)``; unsigned offsets as
    :func:`layer_norm_kernel`'s."""
    loop = loop_for(parallel)

    @jit(parallel, fastmath=("reassoc",))
    def kernel(dy, x, mean, inv_var, gamma, dx, rows, cols):
        n = to_compute(mean, cols)
        ucols = np.uint64(cols)
        for r_ in loop(rows):
            base = np.uint64(r_) * ucols
            mu, iv = mean[r_], inv_var[r_]
            sg, sgx = to_compute(mean, 0.0), to_compute(mean, 0.0)
            for i in range(ucols):
                g = load(dy, base + i)
                if affine:
                    g = g * load(gamma, i)
                sg += g
                sgx += g * (load(x, base + i) - mu) * iv
            mg, mgx = sg / n, sgx / n
            for i in range(ucols):
                g = load(dy, base + i)
                if affine:
                    g = g * load(gamma, i)
                store(dx, base + i, iv * (g - mg - (load(x, base + i) - mu) * iv * mgx))

    return kernel


@jit(False)
def layer_norm_param_grad_kernel(dy, x, mean, inv_var, gamma_diff, beta_diff, rows, cols):
    """Per column, ``gamma_diff = sum over rows of dy * (x - mean) * inv_var`` and ``beta_diff =
    sum over rows of dy``, accumulated in the statistics' dtype in order of rows. Rows run in the
    outer loop and the columns of a row in the inner one, which reads contiguous elements and
    vectorizes: [1024, 128] float32 on one Zen 4 core 236 us a column at a time, 17-22 us so.
    Serial only: on two threads a block of columns each took longer still ([1024, 128]: 37 us;
    [8192, 1024]: 3.7 ms against 3.0, bfloat16 2.4 against 1.1), as did the column-parallel
    kernel before (162 us)."""
    sg, sb = np.zeros(cols, mean.dtype), np.zeros(cols, mean.dtype)
    for r in range(rows):
        m, iv = mean[r], inv_var[r]
        base = r * cols
        for c in range(cols):
            d = load(dy, base + c)
            sb[c] += d
            sg[c] += d * (load(x, base + c) - m) * iv
    for c in range(cols):
        store(gamma_diff, c, sg[c])
        store(beta_diff, c, sb[c])


def layer_norm_steps(ins, outs, plan, attrs):
    """The step of ``layer_norm`` (``gamma`` / ``beta`` None without the affine parameters)."""
    x, gamma, beta, (y, mean, inv), (rows, cols) = ins[0], param(ins, 1), param(ins, 2), outs, plan
    eps = attrs["epsilon"]
    affine = gamma is not None
    kernel = layer_norm_kernel(use_parallel(x.size) and rows > 1, affine)
    g, b = (flat(gamma), flat(beta)) if affine else (flat(x), flat(x))
    return [(kernel, (flat(x), g, b, flat(y), flat(mean), flat(inv), rows, cols, float(eps)))]


def layer_norm_grad_steps(ins, outs, plan, attrs):
    """The step of ``layer_norm_grad`` (``gamma`` None without it)."""
    (dy, x, mean, inv), gamma, (dx,), (rows, cols) = ins[:4], param(ins, 4), outs, plan
    affine = gamma is not None
    kernel = layer_norm_grad_kernel(use_parallel(x.size) and rows > 1, affine)
    return [(kernel, (flat(dy), flat(x), flat(mean), flat(inv),
                      flat(gamma) if affine else flat(x), flat(dx), rows, cols))]


def layer_norm_param_grad_steps(ins, outs, plan, attrs):
    """The step of ``layer_norm_param_grad`` (:func:`layer_norm_param_grad_kernel`)."""
    (dy, x, mean, inv), (gamma_diff, beta_diff), (rows, cols) = ins, outs, plan
    return [(layer_norm_param_grad_kernel, (flat(dy), flat(x), flat(mean), flat(inv),
                                             flat(gamma_diff), flat(beta_diff), rows, cols))]


def train_steps(ins, outs, layout, attrs):
    """The step of a training-mode ``normalization`` (one channel per parallel iteration)."""
    (x, mm, mv, gamma, beta), (y, mean, inv), (outer, c, inner) = ins, outs, layout
    eps, momentum = attrs["epsilon"], attrs["momentum"]
    kernel = norm_train_kernel(use_parallel(x.size) and c > 1)
    return [(kernel, (flat(x), flat(y), mean, inv, flat(mm), flat(mv), flat(gamma), flat(beta),
                      outer, inner, float(eps), float(momentum)))]


def eval_steps(ins, outs, layout, attrs):
    """The step of an eval-mode ``normalization`` (one ``(outer, channel)`` row per iteration)."""
    (x, mm, mv, gamma, beta), y, (outer, c, inner) = ins, outs[0], layout
    eps = attrs["epsilon"]
    kernel = norm_eval_kernel(use_parallel(x.size) and outer * c > 1)
    return [(kernel, (flat(x), flat(y), flat(mm), flat(mv), flat(gamma), flat(beta), outer,
                      inner, float(eps)))]


def grad_steps(ins, outs, layout, attrs):
    """The step of ``normalization_grad``."""
    (x, dy, mean, inv, gamma), (gamma_diff, beta_diff, dx), (outer, c, inner) = ins, outs, layout
    kernel = norm_grad_kernel(use_parallel(x.size) and c > 1)
    return [(kernel, (flat(x), flat(dy), mean, inv, flat(gamma), flat(gamma_diff),
                      flat(beta_diff), flat(dx), outer, inner))]


def increment_steps(ins, outs, plan, attrs):
    """The step of ``increment`` (``counter += 1`` in place)."""
    return [(increment_kernel(), (ins[0].reshape(-1),))]


BUILDERS = normalization.builders(normalization=by_mode(train_steps, eval_steps),
                                  normalization_grad=grad_steps, increment=increment_steps,
                                  layer_norm=layer_norm_steps,
                                  layer_norm_grad=layer_norm_grad_steps,
                                  layer_norm_param_grad=layer_norm_param_grad_steps)
"""Op type -> builder of the batch-norm and layer-norm ops."""
