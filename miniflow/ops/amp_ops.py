"""``amp_white_identity`` and ``amp_black_identity``: copies that pin the AMP colors around them.

Both are identity in value; the gradient of each is the same identity op applied to the incoming
gradient, so the backward path is pinned the same way as the forward one. ``amp_white_identity`` is in
the AMP white list (it makes the gray ops between it and another white op or a sink run in float16),
``amp_black_identity`` in the black list (the gray ops after it run in float32). The
``prune_amp_identity`` pass removes both after the AMP pass, so they cost nothing at run time; a graph
compiled without AMP runs them as plain copies (elementwise ops with the ``identity`` scalar
function, so their kernels are the ``identity`` kernels).

Source: OneFlow PR 9126 "Fix loss scale precision" (``oneflow/user/ops/amp_white_identity_op.cpp``,
``amp_black_identity``).
"""
from __future__ import annotations

import numpy as np

from .common import float_samples, rand
from .elementwise import elementwise, identity

AMP_IDENTITY_OPS = ("amp_white_identity", "amp_black_identity")


def _grad(op):
    return lambda node, out_grads, emit: [emit(op, out_grads[0])]


def _samples():
    def make(dt):
        return [([rand(3, 5, dtype=dt)], {}), ([np.array([0.0, -0.0, np.nan, 6e4], dt)], {}),
                ([rand(0, 2, dtype=dt)], {})]
    return float_samples(make)


for _op, _amp in zip(AMP_IDENTITY_OPS, ("white", "black")):
    elementwise(_op, identity, np.copy, amp=_amp, grad=_grad(_op), samples=_samples,
                doc="out = x; gradient: the same identity op on dy (pins AMP colors, pruned after "
                    "AMP)")
