# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 10: convolutional networks under AMP
#
# What this lesson teaches:
#
# 1. **conv2d is im2col + one matmul.** In the IR a convolution is one `conv2d` node (OneFlow's
#    op, `oneflow/user/ops/conv_op.cpp`); its CPU kernel copies every receptive field into a
#    column of a matrix (im2col, Caffe's scheme) and multiplies the weight `[O, C*kh*kw]` by it:
#    one GEMM. We call the kernel's own `im2col_kernel` by hand and compare.
# 2. **Winograd F(2x2, 3x3)** (Lavin & Gray, CVPR 2016): one 2x2 output tile from a 4x4 input
#    tile with 16 multiplies instead of 36, by hand in NumPy, then the kernel's Winograd path
#    against im2col and a float64 reference.
# 3. **Batch norm's no-cast inputs**: under AMP `normalization` runs on a float16 `x`, but its
#    `moving_mean`, `moving_variance`, `gamma` and `beta` stay float32 (OneFlow's
#    `REGISTER_NO_CAST_REGISTRY`), and why: a float16 moving average stops moving.
# 4. **The AMP coloring of a conv-bn-relu-pool block**: which nodes run in float16 and why
#    (`amp_report()`).
# 5. **A LeNet trained on the digits under AMP**, with a figure of its loss and test accuracy.
#
# Assumes: nn.Graph and its IR (lesson 1), the AMP pass and `amp_report()` (lesson 4), loss
# scaling (lesson 5), a training loop (lesson 7).
#
# Run: `python tutorials/10_convnets_under_amp.py [--quick] [--out DIR]` (--quick: 3 epochs
# instead of 8). Writes a figure.

# %%
import argparse
from pathlib import Path

import numpy as np

import miniflow as mf
from miniflow import nn
from miniflow.amp import GradScaler
from miniflow.data import batches, load_digits
from miniflow.experiments.mlp import EvalGraph, TrainGraph
from miniflow.kernels.cpu.conv import WINOGRAD_WEIGHT, im2col_kernel, winograd_applies
from miniflow.models import lenet
from miniflow.ops import get_op
from miniflow.ops.conv import conv_reference
from miniflow.ops.geometry import conv_geometry
from miniflow.notebook import out_folder, script_args, script_dir

LESSON = script_dir(globals()) / "10_convnets_under_amp.py"
DEFAULT_OUT = LESSON.parent.parent / "tutorial-output" / "10_convnets_under_amp"

# Winograd F(2x2, 3x3)'s matrices (Lavin & Gray, eq. 7): Y = A^T [(G g G^T) * (B^T d B)] A.
B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)


CONV3x3_PAD1 = {"kernel_size": (3, 3), "strides": (1, 1), "padding_before": (1, 1),
                "dilation_rate": (1, 1), "groups": 1}
"""conv2d's attributes (OneFlow's names) for a 3x3 kernel, stride 1, padding 1."""


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def forward_graph(model, amp: bool = False) -> EvalGraph:
    """An inference graph of ``model`` (``miniflow.experiments.mlp.EvalGraph``), under AMP if
    asked."""
    graph = EvalGraph(model)
    if amp:
        graph.config.enable_amp(True)
    return graph


# %% [markdown]
# ## 1. conv2d in the IR, and im2col + one matmul in the kernel

# %%
def part1_im2col() -> None:
    print("== 1. conv2d: one node in the IR, im2col + one matmul in the kernel ==")
    mf.manual_seed(0)
    conv = nn.Conv2d(2, 4, 3, padding=1, bias=False)
    fwd = forward_graph(conv)
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5)).astype(np.float32)
    y = fwd(x).numpy()
    print("IR of nn.Conv2d(2, 4, 3, padding=1, bias=False) on x f32[1, 2, 5, 5]:")
    print(indent(str(fwd.ir)))
    w = conv.weight.numpy()
    g = conv_geometry("conv2d", x.shape, w.shape, {"padding_before": (1, 1)})
    cols = np.empty((g.c * g.kh * g.kw, g.n * g.oh * g.ow), np.float32)
    im2col_kernel(False)(x, cols, g.window())       # the kernel the conv2d plan calls
    print(f"im2col: x [1, 2, 5, 5] -> cols {list(cols.shape)} (one row per (channel, tap), one "
          f"column per output position); column 0 (output (0, 0), zero padding at the border): "
          f"{np.round(cols[:9, 0], 3).tolist()}")
    by_hand = (w.reshape(g.o, -1) @ cols).reshape(y.shape)
    print(f"weight [4, 18] @ cols [18, 25] reshaped to [1, 4, 5, 5] vs the conv2d plan's "
          f"output, max |difference|: {np.abs(by_hand - y).max():.1e}")
    ref = conv_reference([x.astype(np.float64), w.astype(np.float64)], CONV3x3_PAD1)[0]
    print(f"the plan vs the float64 reference (one einsum per tap), max |difference|: "
          f"{np.abs(y - ref).max():.1e}")


# %% [markdown]
# ## 2. Winograd F(2x2, 3x3)

# %%
def part2_winograd() -> None:
    print("\n== 2. Winograd F(2x2, 3x3): a 2x2 output tile with 16 multiplies instead of 36 ==")
    rng = np.random.default_rng(1)
    d, k = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(2)] for i in range(2)])
    u, v = G @ k @ G.T, B_T @ d @ B_T.T            # transformed filter and input tile (4x4)
    tile = A_T @ (u * v) @ A_T.T                    # 16 elementwise products
    print(f"one tile, float64: direct 3x3 correlation (4 outputs x 9 = 36 multiplies) vs "
          f"A^T [(G g G^T) * (B^T d B)] A (16 multiplies), max |difference|: "
          f"{np.abs(direct - tile).max():.1e}")
    print(f"the kernel's weight transform is G (x) G as one [16, 9] matrix (np.kron): equal to "
          f"G g G^T: {np.allclose((WINOGRAD_WEIGHT @ k.ravel()).reshape(4, 4), u)}")
    x = rng.standard_normal((8, 16, 16, 16)).astype(np.float32)
    w = (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
    g = conv_geometry("conv2d", x.shape, w.shape, {"padding_before": (1, 1)})
    mf.manual_seed(0)
    conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
    conv.load_state_dict({"weight": w})
    y = forward_graph(conv)(x).numpy()
    cols = np.empty((g.c * 9, g.n * g.oh * g.ow), np.float32)
    im2col_kernel(False)(x, cols, g.window())
    via_im2col = (w.reshape(16, -1) @ cols).reshape(16, 8, 16, 16).transpose(1, 0, 2, 3)
    ref = conv_reference([x.astype(np.float64), w.astype(np.float64)], CONV3x3_PAD1)[0]
    print(f"conv2d x f32[8, 16, 16, 16], 3x3, 16 -> 16 channels: the plan uses Winograd: "
          f"{winograd_applies(g)} (3x3, stride 1, {4 * g.n * 8 * 8} tiled outputs >= the "
          f"threshold)")
    print(f"  max |Winograd plan - float64 reference| {np.abs(y - ref).max():.1e}, "
          f"max |im2col + matmul - float64 reference| {np.abs(via_im2col - ref).max():.1e} "
          f"(both float32; Winograd's transforms add a few roundings)")
    print(f"  multiply-adds per output: im2col {16 * 9}, Winograd {16 * 16 / 4:.0f} in the GEMMs "
          f"(4/9) plus the transforms' additions")


# %% [markdown]
# ## 3. Batch norm's no-cast inputs

# %%
def part3_batch_norm() -> None:
    print("\n== 3. Batch norm under AMP: x in float16, statistics and affine parameters float32 ==")
    op = get_op("normalization")
    print(f"op 'normalization' is in AMP list {op.amp!r}; its no-cast inputs (never cast to "
          f"float16): {op.no_cast_inputs}")
    print(f"its AMP note: {op.amp_note}")
    # Why: the moving averages change by a small fraction of themselves per step.
    mean16, mean32, batch_mean = np.float16(1.0), np.float32(1.0), 1.003
    for _ in range(1000):
        mean16 = np.float16(0.9 * mean16 + 0.1 * np.float16(batch_mean))
        mean32 = np.float32(0.9 * mean32 + 0.1 * np.float32(batch_mean))
    print(f"why: moving_mean = 0.9 * moving_mean + 0.1 * batch_mean, from 1.0 with every batch "
          f"mean {batch_mean}, 1000 steps: float32 reaches {float(mean32):.4f}, float16 stays at "
          f"{float(mean16):.4f} (each step adds 0.0003, below half of float16's spacing "
          f"{float(np.spacing(np.float16(1.0))):.4f} at 1.0: it rounds away)")
    print("  gamma and beta are parameters: the optimizer updates their float32 master copies, "
          "and the kernel normalizes in float32 anyway, so casting them would only lose bits")


# %% [markdown]
# ## 4. The AMP coloring of a conv-bn-relu-pool block

# %%
def coloring(model, label: str) -> "mf.amp.report.AmpReport":
    """Print the AMP report rows of ``model``'s inference graph on a [2, 1, 8, 8] batch."""
    model.eval()
    fwd = forward_graph(model, amp=True)
    out = fwd(np.random.default_rng(2).standard_normal((2, 1, 8, 8)).astype(np.float32))
    rep = fwd.amp_report()
    print(f"{label}: {rep.n_fp16} float16 nodes, {rep.n_fp32} float32 nodes, {rep.n_casts} "
          f"inserted casts, output {out.dtype!r}")
    for r in rep.rows:
        print(f"  {r.op:<14} {r.outputs:<7} color {r.color:<6} dtype {r.dtype:<7} {r.reason}")
    return rep


def part4_coloring() -> None:
    print("\n== 4. AMP coloring of conv -> batch norm -> relu -> max pool (inference) ==")
    mf.manual_seed(0)
    block = [nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
             nn.MaxPool2d(2)]
    coloring(nn.Sequential(*block), "the block alone")
    print("  (gray batch norm, clear relu and pool lead to no white op: they stay float32)")
    rep = coloring(nn.Sequential(*block, nn.Conv2d(4, 8, 3, padding=1, bias=False)),
                   "the block followed by the next block's conv2d, as inside a network")
    print("inserted casts:")
    print(indent("\n".join(rep.casts)))
    print("no-cast inputs (float32 inputs of float16 nodes):")
    print(indent("\n".join(rep.no_cast)))


# %% [markdown]
# ## 5. A LeNet trained on the digits under AMP

# %%
def accuracy(model, predict: EvalGraph, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()                  # batch norm uses its moving statistics (the graph recompiles)
    acc = float((predict(x).numpy().argmax(axis=1) == y).mean())
    model.train()
    return acc


def part5_train(epochs: int, out: Path) -> None:
    print(f"\n== 5. LeNet (conv-bn-relu-pool x 2, two Linear) on the digits, AMP, {epochs} "
          f"epochs ==")
    data = load_digits()
    x_train = data.x_train.reshape(-1, 1, 8, 8)
    x_test = data.x_test.reshape(-1, 1, 8, 8)
    mf.manual_seed(0)
    model = lenet(data.num_classes)
    scaler = GradScaler(init_scale=2.0 ** 16, growth_interval=50)
    step = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    step.config.enable_amp(True)                 # forward, backward and update in one plan
    step.set_grad_scaler(scaler)
    predict = forward_graph(model, amp=True)
    print(f"model: {sum(p.numpy().size for p in model.parameters())} parameters; SGD lr 0.05 "
          f"momentum 0.9, batch 64, dynamic loss scale from 2^16")
    losses, test_acc, skipped = [], [], 0
    for _ in range(epochs):
        for xb, yb in batches(x_train, data.y_train, 64):
            losses.append(float(step(xb, yb)))
            skipped += bool(scaler.found_inf)
        test_acc.append(accuracy(model, predict, x_test, data.y_test))
    rep = step.amp_report()
    convs = [r for r in rep.rows if r.op.startswith("conv")]
    print(f"training step under AMP: {rep.n_fp16} float16 nodes, {rep.n_fp32} float32 nodes; "
          f"{sum(r.dtype == 'f16' for r in convs)} of {len(convs)} conv2d/conv_*_grad nodes in "
          f"float16")
    bn = model.bn1
    print(f"after training, bn1's moving_mean and moving_variance are "
          f"{bn.running_mean.numpy().dtype} and {bn.running_var.numpy().dtype}, and gamma "
          f"{bn.weight.numpy().dtype} (the no-cast inputs kept them float32)")
    print(f"loss scale: final 2^{np.log2(scaler.scale):.0f}, skipped steps {skipped} of "
          f"{len(losses)}")
    print(f"test accuracy per epoch: {' '.join(f'{100 * a:.1f}' for a in test_acc)}")
    print(f"LeNet test accuracy (AMP): {100 * test_acc[-1]:.2f}% on {len(x_test)} test images")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(losses, lw=0.7, label="training loss (AMP), per step")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(loc="upper right")
    acc_ax = ax.twinx()
    per_epoch = len(losses) // epochs
    acc_ax.plot(per_epoch * np.arange(1, epochs + 1) - 1, 100 * np.array(test_acc), "k.-",
                label="test accuracy")
    acc_ax.set_ylabel("test accuracy (%)")
    acc_ax.legend(loc="center right")
    fig.suptitle(f"LeNet on the digits under AMP: test accuracy {100 * test_acc[-1]:.1f}%")
    fig.tight_layout()
    path = out / "10_lenet_amp.png"
    fig.savefig(path, dpi=100)
    print(f"figure (loss per step, test accuracy per epoch) written to: {path}")


# %%
def main() -> None:
    p = argparse.ArgumentParser(description="Lesson 10: convolutional networks under AMP")
    p.add_argument("--quick", action="store_true", help="3 training epochs instead of 8")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the figure")
    args = p.parse_args(script_args())    # a notebook kernel passes its own arguments
    out_folder(p, args.out)
    mf.set_backend("cpu")
    part1_im2col()
    part2_winograd()
    part3_batch_norm()
    part4_coloring()
    part5_train(3 if args.quick else 8, args.out)


if __name__ == "__main__":
    main()
