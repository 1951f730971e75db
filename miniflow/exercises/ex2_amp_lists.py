"""Exercise 2 checker: the AMP list (color) of four new ops.

The learner's ``amp_lists()`` maps each new op to ``"white"``, ``"black"``, ``"gray"`` or
``"clear"``; each answer is compared with the list the op belongs in by the rules of OneFlow's
``auto_mixed_precision_lists.cpp`` and PyTorch's autocast op reference ("CUDA Ops that can
autocast to float16 / to float32"), and a wrong one is explained with the float16 numbers that
make it wrong, computed here with NumPy.
"""
from __future__ import annotations

import numpy as np

from ..ops.registry import AMP_CATEGORIES
from . import NotYet, learner_call

TITLE = "the AMP color of a new op"
STUB = "ex2_amp_lists.py"
FUNCTION = "amp_lists"


def _logsumexp_in_half() -> str:
    x = np.array([12.0, 3.0, -1.0], np.float16)
    with np.errstate(over="ignore"):
        half = np.log(np.exp(x).sum(dtype=np.float16))
    exact = np.log(np.exp(x.astype(np.float64)).sum())
    return (f"exp(12) = {np.exp(12.0):.0f} is above float16's largest number 65504, so "
            f"logsumexp([12, 3, -1]) in float16 gives {half} instead of {exact:.4f}; PyTorch's "
            f"autocast runs logsumexp (and exp, sum, pow) in float32, and OneFlow leaves exp out "
            f"of its lists so it stays float32")


def _reasons() -> dict:
    """op -> (the right list, why)."""
    return {
        "exercise2_scaled_matmul": ("white", (
            "it is a matmul: the expensive op float16 exists for (tensor cores, half the memory "
            "traffic), and its kernel accumulates the products in float32; OneFlow's white list "
            "has matmul, PyTorch's float16 list has matmul, addmm, baddbmm")),
        "exercise2_logsumexp": ("black", _logsumexp_in_half()),
        "exercise2_flip": ("clear", (
            "it only moves values (like transpose and reshape, which are clear): it is exact in "
            "any dtype, so it runs in whatever dtype its input already has and never needs a "
            "cast of its own")),
        "exercise2_scale_shift": ("gray", (
            "elementwise arithmetic x * a + b (like broadcast_add and the activations): cheap, "
            "accurate enough in float16 between float16 ops, but it must run in float32 after a "
            "float32 (black) op, so it follows its inputs: gray")),
    }


def check(module) -> list:
    """Raise :class:`NotYet` on the first wrong answer; return the passed checks."""
    answers = learner_call(f"{FUNCTION}()", module.amp_lists)
    reasons = _reasons()
    if not isinstance(answers, dict) or set(answers) != set(reasons):
        raise NotYet(f"{FUNCTION}() must return a dict with exactly the keys "
                     f"{sorted(reasons)}; it returned {answers!r}")
    passed = []
    for op, (right, why) in reasons.items():
        got = answers[op]
        if got not in AMP_CATEGORIES:
            raise NotYet(f"{op}: {got!r} is not an AMP list; the lists are {AMP_CATEGORIES}")
        if got != right:
            raise NotYet(f"{op}: you chose {got!r}, but it belongs in {right!r}: {why}.")
        passed.append(f"{op} is {right}: {why}")
    return passed
