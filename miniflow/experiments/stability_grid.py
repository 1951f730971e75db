"""The experiment grid of the loss-scale study (``miniflow.experiments.stability``): the policies,
the static scales of each sweep and the rows of the tables and figures. Its own module so that the
study, its report (``stability_report``) and its figures (``stability_plots``) all read it without
importing each other in a circle."""
from __future__ import annotations

__all__ = ["POLICIES", "ONEFLOW_POLICIES", "SWEEP_LOG2_SCALES", "BF16_LABEL", "CNN_LOG2_SCALES",
           "CNN_ROWS", "CNN_LR", "UNDERFLOW_LOG2_SCALES", "SMALL_LOSS_LOG2_WEIGHT"]

POLICIES = ("none", "legacy", "cast_back", "fp32")
"""Run policies: "none" trains in float32 (AMP off, same scaler); the others are AMP with that
``loss_scale_policy``."""

ONEFLOW_POLICIES = ("legacy", "cast_back")
"""The policies that are OneFlow's (before and after PR 9126); "fp32" is miniflow's design. The
static sweep runs these twice: without skipping non-finite steps, as OneFlow does under a static
loss scale (``CountNotFiniteIfNeeded`` and ``SetDynamicLossScaleSkipIf`` return early without a
dynamic policy), and with miniflow's default ``StaticGradScaler`` (skip)."""

SWEEP_LOG2_SCALES = (0, 8, 12, 15, 16, 17, 20)
BF16_LABEL = "bfloat16 AMP, legacy, no skip (OneFlow)"
"""The bfloat16 row of the static sweep (experiment ``"bfloat16"``): OneFlow's most fragile setup,
the legacy policy without skipping, whose initial gradient is bfloat16: float32's exponent range,
so no static scale of the sweep overflows it."""
CNN_LOG2_SCALES = (12, 15, 16, 17)
CNN_ROWS = (("none", True), ("legacy", False), ("cast_back", False), ("fp32", True))
"""The static sweep on the LeNet: ``(policy, skip_nonfinite)`` per row, OneFlow's policies as
OneFlow runs them (no skip under a static scale), at 2^12 and 2^15 (all train), 2^16 and 2^17
(the float16 initial gradient overflows under OneFlow's policies; at 2^17 real gradients of the
convolutions overflow on some steps too)."""
CNN_LR = 0.05
"""The LeNet's learning rate (``miniflow train --model lenet``'s): at the MLP's 0.1 the weights
move so fast that batch norm's running statistics lag them and the eval accuracy suffers."""
UNDERFLOW_LOG2_SCALES = (0, 4, 8, 12, 16, 20, 24)
SMALL_LOSS_LOG2_WEIGHT = -20
"""The small-gradient regime of the underflow experiment: loss x 2^-20, learning rate x 2^20."""
