"""Exercise 4 checker: the dynamic loss-scale schedule.

The learner's ``update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
growth_interval)`` is run over scripted sequences of steps (overflow or not) and compared step by
step with the rule of PyTorch's ``torch.cuda.amp.GradScaler.update`` (``_amp_update_scale_``,
``aten/src/ATen/native/cuda/AmpKernels.cu``), which miniflow's ``GradScaler`` follows: an
overflow multiplies the scale by ``backoff_factor`` and resets the tracker; a finite step counts,
and the ``growth_interval``-th finite step in a row multiplies it by ``growth_factor`` and resets
the tracker. The reference is miniflow's own op ``dynamic_loss_scale_schedule`` (the one the
loss-scale pass puts in every graph), run by ``miniflow.ir.evaluate``; when PyTorch is installed
every step also runs through ``torch._amp_update_scale_`` itself.
"""
from __future__ import annotations

import importlib.util

import numpy as np

from ..dtype import float32, int64
from ..ir import Graph, evaluate
from ..ops import emitter
from . import NotYet, learner_call

TITLE = "a dynamic loss-scale schedule"
STUB = "ex4_loss_scale_schedule.py"
FUNCTION = "update_scale"

SEQUENCES = [
    # (name, found_inf per step, growth_factor, backoff_factor, growth_interval)
    ("three finite steps with growth_interval 3", [False] * 3, 2.0, 0.5, 3),
    ("an overflow on the first step", [True], 2.0, 0.5, 2000),
    ("two finite steps, an overflow, three finite steps (interval 3)",
     [False, False, True, False, False, False], 2.0, 0.5, 3),
    ("seven finite steps with growth_interval 2", [False] * 7, 2.0, 0.5, 2),
    ("three overflows in a row, factors 4 and 0.25", [True] * 3, 4.0, 0.25, 2),
    ("PyTorch's defaults (2, 0.5, 2000) over 4001 finite steps", [False] * 4001, 2.0, 0.5, 2000),
]


def reference(scale: float, tracker: int, found_inf: bool, growth_factor: float,
              backoff_factor: float, growth_interval: int) -> tuple:
    """One step of miniflow's ``dynamic_loss_scale_schedule`` op (``ir.evaluate``, no minimum
    scale, as in PyTorch): ``(new scale, new tracker)``."""
    g = Graph()
    count = g.add_constant(np.array([int(found_inf)], np.int64))
    s = g.add_variable("loss_scale", (1,), float32, data=np.array([scale], np.float32))
    t = g.add_variable("growth_tracker", (1,), int64, data=np.array([tracker], np.int64))
    emitter(g)("dynamic_loss_scale_schedule", count, s, t, growth_factor=growth_factor,
               backoff_factor=backoff_factor, growth_interval=growth_interval, min_scale=0.0)
    new = evaluate(g, [])
    return float(new["loss_scale"][0]), int(new["growth_tracker"][0])


def _torch_step(torch, scale, tracker, found_inf, gf, bf, gi) -> tuple:
    s = torch.tensor([scale], dtype=torch.float32)
    t = torch.tensor([tracker], dtype=torch.int32)
    torch._amp_update_scale_(s, t, torch.tensor([float(found_inf)]), gf, bf, gi)
    return float(s[0]), int(t[0])


def check(module) -> list:
    """Raise :class:`NotYet` on the first wrong step; return the passed checks."""
    torch = None
    if importlib.util.find_spec("torch") is not None:
        import torch
    passed = []
    for name, infs, gf, bf, gi in SEQUENCES:
        scale, tracker = 1024.0, 0
        ref = (scale, tracker)
        for i, found_inf in enumerate(infs):
            want = reference(*ref, found_inf, gf, bf, gi)
            if torch is not None:
                assert _torch_step(torch, *ref, found_inf, gf, bf, gi) == want, "torch disagrees"
            got = learner_call(f"{FUNCTION}({scale}, {tracker}, {found_inf}, {gf}, {bf}, {gi})",
                               module.update_scale, scale, tracker, found_inf, gf, bf, gi)
            if not (isinstance(got, tuple) and len(got) == 2):
                raise NotYet(f"{FUNCTION} must return a tuple (new scale, new growth_tracker); "
                             f"it returned {got!r}")
            if (float(got[0]), int(got[1])) != want:
                what = "an overflow (found_inf=True)" if found_inf else "a finite step"
                raise NotYet(
                    f"{name}: at step {i + 1}, {what}, from scale {scale:g} and growth_tracker "
                    f"{tracker} (growth_factor {gf}, backoff_factor {bf}, growth_interval {gi}), "
                    f"you returned (scale {got[0]:g}, tracker {got[1]}), the schedule gives "
                    f"(scale {want[0]:g}, tracker {want[1]}). " + (
                        "An overflow multiplies the scale by backoff_factor and restarts the "
                        "count of finite steps at 0." if found_inf else
                        "A finite step adds 1 to the tracker; when it reaches growth_interval "
                        "the scale is multiplied by growth_factor and the tracker restarts at 0."))
            scale, tracker = got
            ref = want
        passed.append(f"{name}: ends at scale {ref[0]:g}, tracker {ref[1]}")
    if torch is not None:
        passed.append("the reference schedule agrees with torch._amp_update_scale_ at every step")
    return passed
