# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %%
"""Lesson 6: controlling gray ops with ``amp_black_identity`` and ``amp_white_identity``.

What this lesson shows:

1. Gray ops (``bias_add``, ``tanh``, softmax cross-entropy, ``reduce_sum``, ``scalar_mul`` and their
   gradients) take their precision from their neighbours (lesson 4). Two identity ops let model code
   pin it, without changing any value:

   * ``miniflow.amp.black_identity(x)`` is in the black list: the gray ops *after* it (and their
     gradients) run in float32.
   * ``miniflow.amp.white_identity(x)`` is in the white list: the gray ops between it and another
     white op (or a sink) run in float16.

   Both are removed right after the AMP pass (``prune_amp_identity``): no cost at run time.
2. Where you put them changes the colors (``amp_report()``), shown here for five placements on one
   model, forward and backward.
3. ... and the outcome of training: a white identity on the loss pulls the whole loss-gradient
   path to float16, so the scaled initial gradient is float16 again and the loss scale can no
   longer exceed 2^15 even under the default ``"fp32"`` policy (lesson 5).
4. A black identity on the logits is the user-side fix of the ``"legacy"`` policy (OneFlow before
   PR 9126): the initial gradient becomes float32, and a static scale of 2^16, which makes "legacy"
   skip every step (with miniflow's skipping ``StaticGradScaler``; OneFlow itself would apply the
   non-finite steps and turn the weights NaN at step 1), trains.

Assumes from lesson 4: AMP lists and colors, ``amp_report()``, casts; lesson 5: loss scalers,
skipped steps, the three policies, why a float16 initial gradient limits the scale.

Run:  python tutorials/06_gray_node_control.py [--quick]   (about 4 s; no figure)
"""
import argparse
import warnings

import numpy as np

import miniflow as mf
from miniflow import nn
from miniflow.amp import GradScaler, StaticGradScaler, black_identity, white_identity
from miniflow.data import batches, load_digits
from miniflow.experiments.mlp import EvalGraph, accuracy
from miniflow.notebook import script_args
from miniflow.passes.autograd import AutogradState
from miniflow.passes.loss_scale import LossScaleOverflowWarning, LossScaleState

PLACEMENTS = {
    "none": "no identity",
    "black(hidden)": "black_identity on fc1's output, before tanh",
    "white(logits)": "white_identity on the logits",
    "white(loss)": "white_identity on the loss",
    "black(logits)": "black_identity on the logits",
}
GRAY_ROWS = [  # (op type, occurrence in graph order) -> what it is in this model
    (("bias_add", 0), "fwd  bias_add of fc1"),
    (("tanh", 0), "fwd  tanh"),
    (("bias_add", 1), "fwd  bias_add of fc2 (logits)"),
    (("sparse_softmax_cross_entropy", 0), "fwd  softmax cross-entropy"),
    (("reduce_sum", 0), "fwd  sum over the batch"),
    (("scalar_mul", 0), "fwd  * 1/N (mean = the loss)"),
    (("scalar_mul", 1), "bwd  * 1/N"),
    (("sparse_softmax_cross_entropy_grad", 0), "bwd  cross-entropy grad"),
    (("reduce_sum", 1), "bwd  fc2 bias grad"),
    (("tanh_grad", 0), "bwd  tanh grad"),
    (("reduce_sum", 2), "bwd  fc1 bias grad"),
]


# %%
class Net(nn.Module):
    """``Linear(64, 64) -> tanh -> Linear(64, 10)``, with an identity where ``placement`` says."""

    def __init__(self, placement: str):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(64, 10)
        self.placement = placement

    def forward(self, x):
        h = self.fc1(x)
        if self.placement == "black(hidden)":
            h = black_identity(h)
        logits = self.fc2(h.tanh())
        if self.placement == "white(logits)":
            logits = white_identity(logits)
        if self.placement == "black(logits)":
            logits = black_identity(logits)
        return logits


# %%
class TrainStep(nn.Graph):
    def __init__(self, model, placement, policy, scaler):
        super().__init__()
        self.model = model
        self.placement = placement
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        self.config.enable_amp(True, loss_scale_policy=policy)
        self.set_grad_scaler(scaler)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        if self.placement == "white(loss)":
            loss = white_identity(loss)
        loss.backward()
        return loss


# %%
def run(placement, policy, scaler, data, epochs):
    """Train; returns (step graph, model, steps skipped, largest applied scale, last loss)."""
    mf.manual_seed(0)
    model = Net(placement)
    step = TrainStep(model, placement, policy, scaler)
    rng = np.random.default_rng(0)
    skipped, applied, loss = 0, [], float("nan")
    with np.errstate(invalid="ignore", over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", LossScaleOverflowWarning)  # lesson 5 showed it
        for _ in range(epochs):
            for xb, yb in batches(data.x_train, data.y_train, 64, rng=rng):
                scale = scaler.scale
                loss = float(step(xb, yb))
                skipped += scaler.found_inf
                if not scaler.found_inf:
                    applied.append(scale)
    return step, model, skipped, max(applied, default=0.0), loss


# %%
def plan_for_batch(step, n: int):
    """``step``'s plan for batches of ``n`` (``step.ir`` is the last one compiled): its ``graph``
    and ``context`` (what the passes recorded)."""
    return next(p for p in step.plans.values() if p.graph.inputs[0].shape[0] == n)


# %%
def colors(step) -> dict:
    """(op type, occurrence) -> 'f16 white' etc., from the graph's amp_report()."""
    seen, out = {}, {}
    for r in step.amp_report().rows:
        if r.op.startswith("amp_"):
            continue  # the identity ops themselves, pruned after AMP
        k = seen.get(r.op, 0)
        seen[r.op] = k + 1
        out[r.op, k] = f"{r.dtype.split(',')[0]} {r.color}"
    return out


# %%
def main():
    p = argparse.ArgumentParser(description="Lesson 6: gray-node control with AMP identities")
    p.add_argument("--quick", action="store_true", help="3 epochs per run instead of 10")
    args = p.parse_args(script_args())
    mf.set_backend("cpu")
    epochs = 3 if args.quick else 10
    data = load_digits()

    print("== 1. Five placements of an identity on one model ==")
    for name, what in PLACEMENTS.items():
        print(f"placement {name:<14}: {what}")

    print(f"\n== 2. Colors of the gray ops (amp_report; dtype and color; policy 'fp32', "
          f"dynamic scaler), {epochs} epochs each ==")
    results = {}
    for name in PLACEMENTS:
        scaler = GradScaler(init_scale=2.0 ** 16, growth_interval=10)
        step, model, skipped, top, loss = run(name, "fp32", scaler, data, epochs)
        acc = accuracy(EvalGraph(model), data.x_test, data.y_test)
        results[name] = (step, skipped, top, loss, acc, scaler)
    header = "".join(f"{name:>15}" for name in PLACEMENTS)
    print(f"{'gray node (fwd/bwd), placement:':<40}{header}")
    for key, label in GRAY_ROWS:
        cells = "".join(f"{colors(results[name][0]).get(key, '-'):>15}" for name in PLACEMENTS)
        print(f"{'gray node ' + label:<40}{cells}")
    tally = []
    for name in PLACEMENTS:
        c = colors(results[name][0]).values()
        tally.append(f"{sum(v.startswith('f16') for v in c)}/{sum(v.startswith('f32') for v in c)}")
    print(f"{'all colored nodes, float16/float32:':<40}" + "".join(f"{t:>15}" for t in tally))
    why = next(r for r in results["black(hidden)"][0].amp_report().rows if r.op == "tanh")
    print(f"why tanh is {why.color} with black(hidden): {why.reason}")
    why = next(r for r in results["white(loss)"][0].amp_report().rows
               if r.op == "sparse_softmax_cross_entropy_grad")
    print(f"why the cross-entropy grad is {why.color} with white(loss): {why.reason}")

    print("\n== 3. The outcome of training (policy 'fp32', dynamic scaler from 2^16, growth "
          "every 10 steps) ==")
    for name, (step, skipped, top, loss, acc, scaler) in results.items():
        print(f"training with {name:<14}: skipped {skipped:2d}/{epochs * 23} steps, largest "
              f"applied scale 2^{np.log2(top):.0f}, final scale 2^{np.log2(scaler.scale):.0f}, "
              f"last loss {loss:.7f} (a float16 number: {float(np.float16(loss)) == loss}), "
              f"test accuracy {100 * acc:.1f}%")
    plan = plan_for_batch(results["white(loss)"][0], 64)
    ir, ig = plan.graph, plan.context.state[LossScaleState].scaled_initial_grad
    names = ir.names()
    readers = [n.format(names) for n in ir.uses(ig)]
    where = f"%{names[ig]}" if ig in names else "(inside a fused node)"
    print(f"scaled initial gradient with white(loss), batch 64: {where} {ig.type_str}, first "
          f"read by: {readers[0] if readers else '-'}")
    print("reading: white(loss) made the loss path float16, so the scaled initial gradient is cast "
          "to float16 and a scale of 2^16 overflows: the scale is capped at 2^15 and the loss "
          "value itself is a float16 number; the other placements leave the "
          "loss-gradient path float32 and let the scale grow")

    print("\n== 4. The user-side fix of the 'legacy' policy: black_identity on the logits ==")
    for name in ("none", "black(logits)"):
        scaler = StaticGradScaler(2.0 ** 16, max_consecutive_skips=10 ** 6)
        step, model, skipped, _, loss = run(name, "legacy", scaler, data, epochs)
        acc = accuracy(EvalGraph(model), data.x_test, data.y_test)
        initial = step.compile_context.state[AutogradState].initial_grad
        print(f"legacy policy, static scale 2^16, placement {name:<14}: skipped "
              f"{skipped:2d}/{epochs * 23} steps, initial gradient "
              f"{initial.dtype.short}, test accuracy {100 * acc:.1f}%")
    print("reading: with the black identity, the loss and its gradient path are float32, so even "
          "'legacy' (which makes the scale in the initial gradient's dtype) has nothing to cast")


# %%
if __name__ == "__main__":
    main()
