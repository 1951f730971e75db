"""Optimizer update CPU kernels (in place, no outputs): ``sgd_update``, ``adam_update``,
``adadelta_update`` and the multi-tensor updates with cast.

The loops over the scalar bodies of ``kernels.common.update`` (PyTorch's rules; the builders are
there too). Unless ``skip_if[0] != 0`` (then nothing changes), a kernel converts its
hyperparameters to the model's compute type (``to_compute``) and runs the body on every element,
loading and storing through ``fp16``. The learning rate is read from its f64[1] array when the
kernel runs; Adam's bias corrections are float64.

The multi-tensor kernels take tuples of 1-D views (one tuple per group: models, diffs, copies,
state; packs of up to ``TENSOR_PACK`` tensors, one call each, ``common.pack``) and loop over the
first ``count`` tensors: per element ``g = load(diff) * scale`` (float32; the product
the unfused ``scalar_mul_by_tensor`` stores), the same body as the single-tensor kernel, and one
extra store of the new weight into its half copy, rounded as a ``cast`` rounds it: the fused
graph computes the bits of the unfused one. The SGD kernel's float32 models with bfloat16 copies
run two explicit vectors at a time (:func:`_sgd_pairs`), the same bits.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import types
from numba.extending import overload

from .common import flat, jit, jitable, loop_for, pack, tensor_packs, use_parallel
from .fp16 import load, store, to_compute
from .simd import LANES, vload_at, vsplat, vstore_at, vstore_bf16_pair
from ..common.update import (adadelta_builder, adadelta_element, adam_builder,
                             adam_corrections, adam_element, multi_adadelta_cast_builder,
                             multi_adam_cast_builder, multi_sgd_cast_builder, sgd_builder,
                             sgd_element)

__all__ = ["sgd_kernel", "adam_kernel", "adadelta_kernel", "multi_sgd_kernel",
           "multi_adam_kernel", "multi_adadelta_kernel", "BUILDERS"]

_sgd, _corrections, _adam = jitable(sgd_element), jitable(adam_corrections), jitable(adam_element)
_adadelta = jitable(adadelta_element)


@functools.cache
def sgd_kernel(momentum: bool, nesterov: bool, dampened: bool, parallel: bool):
    """``kernel(p, grad, lr, skip_if, buf, mu, wd, one_d, step)``: ``p[i], buf[i] =
    sgd_element(...)`` with the learning rate ``lr[0]``, unless skip_if[0] (buf is read and
    written only with ``momentum``; ``nesterov``: Nesterov momentum; ``dampened``: ``one_d = 1 -
    dampening``, the buffer's first step is ``step[0] == 0`` and ``step += 1`` after it, else
    neither is read)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(p, grad, lr, skip_if, buf, mu, wd, one_d, step):
        if skip_if[0] != 0:
            return
        lr_c, mu_c, wd_c = to_compute(p, lr[0]), to_compute(p, mu), to_compute(p, wd)
        one_d_c, first = to_compute(p, one_d), step[0] == 0 if dampened else False
        for i in loop(p.size):
            b = load(buf, i) if momentum else mu_c
            pi, b = _sgd(load(p, i), load(grad, i), b, lr_c, mu_c, wd_c, momentum, nesterov,
                         dampened, one_d_c, first)
            if momentum:
                store(buf, i, b)
            store(p, i, pi)
        if dampened:
            step[0] += 1

    return kernel


@functools.cache
def adam_kernel(amsgrad: bool, parallel: bool):
    """``kernel(p, grad, lr, skip_if, m, v, step, beta1, beta2, eps, wd, vmax)``, unless
    skip_if[0]: ``step += 1``, then ``p[i], m[i], v[i], vmax[i] = adam_element(...)`` with the
    learning rate ``lr[0]`` (``wd``: the pair ``(weight_decay, decoupled_weight_decay)``;
    ``vmax`` read and written only with ``amsgrad``)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(p, grad, lr, skip_if, m, v, step, beta1, beta2, eps, wd, vmax):
        if skip_if[0] != 0:
            return
        step[0] += 1
        step_size, bc2_sqrt = _corrections(lr[0], beta1, beta2, step[0])
        hyper = (to_compute(p, step_size), to_compute(p, bc2_sqrt), to_compute(p, beta1),
                 to_compute(p, beta2), to_compute(p, 1.0 - beta1), to_compute(p, 1.0 - beta2),
                 to_compute(p, eps), to_compute(p, wd[0]), to_compute(p, 1.0 - lr[0] * wd[1]))
        for i in loop(p.size):
            pi, mi, vi, xi = _adam(load(p, i), load(grad, i), load(m, i), load(v, i),
                                   load(vmax, i) if amsgrad else hyper[0], hyper, amsgrad)
            if amsgrad:
                store(vmax, i, xi)
            store(m, i, mi)
            store(v, i, vi)
            store(p, i, pi)

    return kernel


@functools.cache
def adadelta_kernel(maximize: bool, parallel: bool):
    """``kernel(p, grad, lr, skip_if, square_avg, acc_delta, step, rho, eps, wd)``, unless
    skip_if[0]: ``step += 1``, then ``p[i], square_avg[i], acc_delta[i] =
    adadelta_element(...)`` with the learning rate ``lr[0]`` (``maximize``: the gradient's
    negative)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(p, grad, lr, skip_if, square_avg, acc_delta, step, rho, eps, wd):
        if skip_if[0] != 0:
            return
        step[0] += 1
        lr_c, rho_c, one_rho = to_compute(p, lr[0]), to_compute(p, rho), to_compute(p, 1.0 - rho)
        eps_c, wd_c = to_compute(p, eps), to_compute(p, wd)
        for i in loop(p.size):
            pi, si, ai = _adadelta(load(p, i), load(grad, i), load(square_avg, i),
                                   load(acc_delta, i), lr_c, rho_c, one_rho, eps_c, wd_c, maximize)
            store(square_avg, i, si)
            store(acc_delta, i, ai)
            store(p, i, pi)

    return kernel


PAIR = 2 * LANES
"""Elements of one step of :func:`_sgd_pairs`: two vectors."""

CHUNK = 1 << 14
"""Elements of one iteration of the parallel kernel's ``prange`` over :func:`_sgd_pairs` (a
multiple of ``PAIR``; the serial kernel calls it once per tensor)."""


def _vector_pairs(p, d, c, buf):
    """How many steps of :func:`_sgd_pairs` cover the start of ``p`` (njit only): ``p.size //
    PAIR`` for float32 models and buffers, bfloat16 copies and float32 or bfloat16 gradients,
    else 0 (a constant: the other types compile the element loop alone)."""
    raise NotImplementedError("_vector_pairs is only callable from Numba-compiled code")


def _sgd_pairs(p, d, c, buf, start, stop, lr, mu, wd, s, momentum, nesterov):
    """The SGD step with the bfloat16 copy on elements ``start`` to ``stop`` (multiples of
    ``PAIR``), ``PAIR`` at a time (njit only)."""
    raise NotImplementedError("_sgd_pairs is only callable from Numba-compiled code")


def _pairs_apply(p, d, c, buf) -> bool:
    return (p.dtype == types.float32 and buf.dtype == types.float32
            and c.dtype == types.int16 and d.dtype in (types.float32, types.int16))


@overload(_vector_pairs)
def _vector_pairs_impl(p, d, c, buf):
    if _pairs_apply(p, d, c, buf):
        return lambda p, d, c, buf: p.size // PAIR
    return lambda p, d, c, buf: 0


@overload(_sgd_pairs, prefer_literal=True)
def _sgd_pairs_impl(p, d, c, buf, start, stop, lr, mu, wd, s, momentum, nesterov):
    """``sgd_element`` on two ``simd.f32vec`` at a time (their operators are float32 lane by
    lane: the bits of the element loop), both stored, then one ``vstore_bf16_pair`` for their
    copy. ``momentum`` and ``nesterov`` are the kernel's constants (literal types: compiled in).

    Why: as AVX2 LLVM vectorized the element loop 8 elements at a time, 28 instructions, 12 of
    them the copy's rounding, NaN select and narrowing (``vextractf128`` + ``vpackusdw`` per 8
    lanes, a ``vcmpunordps``, the quiet NaN and a ``vblendvps`` per vector); two vectors share one
    pack (``vpackusdw`` + ``vpermq``) and one NaN test (a branch to a masked store, never taken
    for finite weights): 44 instructions per 16 elements. The fused update of the wide MLP (64 x
    1024, 1024 x 1024, 1024 x 10 and biases: 1.1M elements), momentum, bfloat16 gradients and
    copies, AMD EPYC Zen 4, one core, interleaved medians of 15 rounds in two runs: as AVX2
    (NUMBA_CPU_NAME=haswell) 355-366 -> 291-304 us, natively (AVX-512, where the pair's NaN test
    replaces two masked ``vpord``) 272-308 -> 235-272 us; the float32 SGD 221-243 as AVX2."""
    if not _pairs_apply(p, d, c, buf):
        return lambda p, d, c, buf, start, stop, lr, mu, wd, s, momentum, nesterov: None
    heavy, nest = (getattr(t, "literal_value", None) for t in (momentum, nesterov))
    if heavy is None or nest is None:
        return None                             # only the literal flags of a kernel's closure

    def impl(p, d, c, buf, start, stop, lr, mu, wd, s, momentum, nesterov):
        lr_v, mu_v, s_v = vsplat(lr), vsplat(mu), vsplat(s)   # wd stays a number: its test
        for i in range(start, stop, PAIR):
            j = i + LANES
            x, bx = _sgd(vload_at(p, i), vload_at(d, i) * s_v,
                         vload_at(buf, i) if heavy else mu_v, lr_v, mu_v, wd, heavy, nest,
                         False, mu_v, False)
            y, by = _sgd(vload_at(p, j), vload_at(d, j) * s_v,
                         vload_at(buf, j) if heavy else mu_v, lr_v, mu_v, wd, heavy, nest,
                         False, mu_v, False)
            if heavy:
                vstore_at(buf, i, bx)
                vstore_at(buf, j, by)
            vstore_at(p, i, x)
            vstore_at(p, j, y)
            vstore_bf16_pair(c, i, x, y)

    return impl


@functools.cache
def multi_sgd_kernel(momentum: bool, nesterov: bool, dampened: bool, parallel: bool):
    """``kernel(count, models, diffs, copies, bufs, lr, skip_if, scale, mu, wd, one_d, steps)``
    (tuples of 1-D views, ``common.pack`` s; ``bufs`` read and written only with ``momentum``):
    unless skip_if[0], for every tensor ``k < count`` and element i ``g = diffs[k][i] *
    scale[0]``, ``models[k][i], bufs[k][i] = sgd_element(...)``, ``copies[k][i] = models[k][i]``
    rounded to the copy's half type (``nesterov``: Nesterov momentum; ``dampened``: ``one_d``
    and ``steps`` as :func:`sgd_kernel`'s ``step``, per tensor). Float32 models with bfloat16
    copies run ``PAIR`` elements a step (:func:`_sgd_pairs`; not with ``dampened``), the last
    ``size % PAIR`` one at a time."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(count, models, diffs, copies, bufs, lr, skip_if, scale, mu, wd, one_d, steps):
        if skip_if[0] != 0:
            return
        p0 = models[0]
        lr_c, mu_c, wd_c = to_compute(p0, lr[0]), to_compute(p0, mu), to_compute(p0, wd)
        s, one_d_c = to_compute(p0, scale[0]), to_compute(p0, one_d)
        for k in range(count):
            p, d, c, buf = models[k], diffs[k], copies[k], bufs[k]
            first = steps[k][0] == 0 if dampened else False
            if dampened:
                steps[k][0] += 1
            n = 0 if dampened else _vector_pairs(p, d, c, buf) * PAIR
            if n > 0:
                chunk = CHUNK if parallel else n
                for q in loop((n + chunk - 1) // chunk):
                    _sgd_pairs(p, d, c, buf, q * chunk, min(n, q * chunk + chunk), lr_c, mu_c,
                               wd_c, s, momentum, nesterov)
            if n == p.size:
                continue
            for i in loop(n, p.size):
                b = load(buf, i) if momentum else mu_c
                pi, b = _sgd(load(p, i), load(d, i) * s, b, lr_c, mu_c, wd_c, momentum, nesterov,
                             dampened, one_d_c, first)
                if momentum:
                    store(buf, i, b)
                store(p, i, pi)
                store(c, i, pi)

    return kernel


@functools.cache
def multi_adam_kernel(amsgrad: bool, parallel: bool):
    """``kernel(count, models, diffs, copies, ms, vs, steps, lr, skip_if, scale, beta1, beta2,
    eps, wd, vmaxs)`` (tuples: ``common.pack`` s): unless skip_if[0], for every tensor
    ``k < count`` ``steps[k] += 1``, then per element
    ``g = diffs[k][i] * scale[0]``, ``adam_element`` on the model and moments, and the half copy
    of the new weight (``wd`` and ``vmaxs`` as for :func:`adam_kernel`)."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(count, models, diffs, copies, ms, vs, steps, lr, skip_if, scale, beta1, beta2,
               eps, wd, vmaxs):
        if skip_if[0] != 0:
            return
        p0 = models[0]
        s = to_compute(p0, scale[0])
        for k in range(count):
            p, d, c, m, v, step = models[k], diffs[k], copies[k], ms[k], vs[k], steps[k]
            vmax = vmaxs[k]
            step[0] += 1
            step_size, bc2_sqrt = _corrections(lr[0], beta1, beta2, step[0])
            hyper = (to_compute(p, step_size), to_compute(p, bc2_sqrt), to_compute(p, beta1),
                     to_compute(p, beta2), to_compute(p, 1.0 - beta1),
                     to_compute(p, 1.0 - beta2), to_compute(p, eps), to_compute(p, wd[0]),
                     to_compute(p, 1.0 - lr[0] * wd[1]))
            for i in loop(p.size):
                pi, mi, vi, xi = _adam(load(p, i), load(d, i) * s, load(m, i), load(v, i),
                                       load(vmax, i) if amsgrad else hyper[0], hyper, amsgrad)
                if amsgrad:
                    store(vmax, i, xi)
                store(m, i, mi)
                store(v, i, vi)
                store(p, i, pi)
                store(c, i, pi)

    return kernel


@functools.cache
def multi_adadelta_kernel(maximize: bool, parallel: bool):
    """``kernel(count, models, diffs, copies, square_avgs, acc_deltas, steps, lr, skip_if,
    scale, rho, eps, wd)`` (tuples: ``common.pack`` s): unless skip_if[0], for every tensor
    ``k < count`` ``steps[k] += 1``, then per element ``g = diffs[k][i] * scale[0]``,
    ``adadelta_element`` on the model and its state, and the half copy of the new weight."""
    loop = loop_for(parallel)

    @jit(parallel)
    def kernel(count, models, diffs, copies, square_avgs, acc_deltas, steps, lr, skip_if, scale,
               rho, eps, wd):
        if skip_if[0] != 0:
            return
        p0 = models[0]
        s = to_compute(p0, scale[0])
        lr_c, rho_c, one_rho = to_compute(p0, lr[0]), to_compute(p0, rho), to_compute(p0, 1.0 - rho)
        eps_c, wd_c = to_compute(p0, eps), to_compute(p0, wd)
        for k in range(count):
            p, d, c, sq, acc = models[k], diffs[k], copies[k], square_avgs[k], acc_deltas[k]
            steps[k][0] += 1
            for i in loop(p.size):
                pi, si, ai = _adadelta(load(p, i), load(d, i) * s, load(sq, i), load(acc, i),
                                       lr_c, rho_c, one_rho, eps_c, wd_c, maximize)
                store(sq, i, si)
                store(acc, i, ai)
                store(p, i, pi)
                store(c, i, pi)

    return kernel


def _packed(arrays, part) -> tuple:
    """The pack (``common.pack``) of ``arrays[k]``'s 1-D kernel views, ``k`` in ``part``."""
    return pack([flat(arrays[k]) for k in part])


def multi_sgd_steps(models, diffs, copies, bufs, lr, skip_if, scale, mu, wd, nesterov, dampening,
                    step_arrays):
    """A call of :func:`multi_sgd_kernel` per pack of tensors (``common.tensor_packs``; the models
    stand in for the buffers without momentum, the skip_if for the step counts without
    dampening: the kernel never touches them then)."""
    momentum, bufs = bufs is not None, models if bufs is None else bufs
    dampened = step_arrays is not None
    counts = step_arrays if dampened else [skip_if] * len(models)
    steps = []
    for part in tensor_packs(len(models)):
        size = sum(models[k].size for k in part)
        kernel = multi_sgd_kernel(momentum, nesterov, dampened, use_parallel(size))
        steps.append((kernel, (len(part), _packed(models, part), _packed(diffs, part),
                               _packed(copies, part), _packed(bufs, part), lr.reshape(-1),
                               skip_if.reshape(-1), scale.reshape(-1), mu, wd, 1.0 - dampening,
                               _packed(counts, part))))
    return steps


def multi_adam_steps(models, diffs, copies, ms, vs, steps, lr, skip_if, scale, beta1, beta2,
                     eps, wd, vmaxs):
    """A call of :func:`multi_adam_kernel` per pack of tensors (``common.tensor_packs``; the
    first moments stand in for ``vmaxs`` without amsgrad: the kernel never touches them then)."""
    amsgrad, vmaxs = vmaxs is not None, ms if vmaxs is None else vmaxs
    calls = []
    for part in tensor_packs(len(models)):
        size = sum(models[k].size for k in part)
        calls.append((multi_adam_kernel(amsgrad, use_parallel(size)),
                      (len(part), _packed(models, part), _packed(diffs, part),
                       _packed(copies, part), _packed(ms, part), _packed(vs, part),
                       _packed(steps, part), lr.reshape(-1),
                       skip_if.reshape(-1), scale.reshape(-1), beta1, beta2, eps, wd,
                       _packed(vmaxs, part))))
    return calls


def multi_adadelta_steps(models, diffs, copies, square_avgs, acc_deltas, steps, lr, skip_if,
                         scale, rho, eps, wd, maximize):
    """A call of :func:`multi_adadelta_kernel` per pack of tensors (``common.tensor_packs``)."""
    calls = []
    for part in tensor_packs(len(models)):
        size = sum(models[k].size for k in part)
        calls.append((multi_adadelta_kernel(maximize, use_parallel(size)),
                      (len(part), *(_packed(a, part) for a in (models, diffs, copies,
                                                               square_avgs, acc_deltas, steps)),
                       lr.reshape(-1), skip_if.reshape(-1), scale.reshape(-1), rho, eps, wd)))
    return calls


def sgd_steps(p, grad, lr, skip_if, buf, mu, wd, nesterov, dampening, step):
    """One call of :func:`sgd_kernel` (a one-element stand-in for ``buf`` without momentum, the
    skip_if for ``step`` without dampening)."""
    kernel = sgd_kernel(buf is not None, nesterov, step is not None, use_parallel(p.size))
    buf = flat(np.zeros(1, p.dtype)) if buf is None else flat(buf)
    return [(kernel, (flat(p), flat(grad), lr.reshape(-1), skip_if.reshape(-1), buf, mu, wd,
                      1.0 - dampening, (skip_if if step is None else step).reshape(-1)))]


def adam_steps(p, grad, lr, skip_if, m, v, step, beta1, beta2, eps, wd, vmax):
    """One call of :func:`adam_kernel` (``m`` stands in for ``vmax`` without amsgrad)."""
    return [(adam_kernel(vmax is not None, use_parallel(p.size)),
             (flat(p), flat(grad), lr.reshape(-1), skip_if.reshape(-1), flat(m), flat(v),
              step.reshape(-1), beta1, beta2, eps, wd, flat(m if vmax is None else vmax)))]


def adadelta_steps(p, grad, lr, skip_if, square_avg, acc_delta, step, rho, eps, wd, maximize):
    """One call of :func:`adadelta_kernel`."""
    return [(adadelta_kernel(maximize, use_parallel(p.size)),
             (flat(p), flat(grad), lr.reshape(-1), skip_if.reshape(-1), flat(square_avg),
              flat(acc_delta), step.reshape(-1), rho, eps, wd))]


BUILDERS = {"sgd_update": sgd_builder(sgd_steps), "adam_update": adam_builder(adam_steps),
            "adadelta_update": adadelta_builder(adadelta_steps),
            "multi_tensor_sgd_update_with_cast": multi_sgd_cast_builder(multi_sgd_steps),
            "multi_tensor_adam_update_with_cast": multi_adam_cast_builder(multi_adam_steps),
            "multi_tensor_adadelta_update_with_cast":
                multi_adadelta_cast_builder(multi_adadelta_steps)}
"""Op type -> builder for the optimizer updates."""
