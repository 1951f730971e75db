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
# # Lesson 11: data parallel training
#
# What this lesson teaches:
#
# 1. **The `data_parallel` pass's `all_reduce` nodes in the IR**: after autograd and AMP, every
#    bucket of parameter gradients becomes one `all_reduce {reduce='mean'}` node (PyTorch DDP's
#    gradient averaging, as graph nodes); a float16 bucket is cast to float32 around it (MPI has
#    no float16 sum).
# 2. **Buckets**: gradients are grouped in reverse parameter order (the order backward makes
#    them) until a bucket holds `bucket_cap_mb` MiB (DDP's rule, 25 MiB by default).
# 3. **Why the non-finite count is summed across ranks**: the loss-scale pass counts the infs and
#    NaNs of the gradients (`multi_count_not_finite`) and then `all_reduce {reduce='sum'}`s the
#    counts, so the decision to skip a step and change the loss scale is the same on every rank:
#    one rank overflowing skips every rank, and the replicas stay bit-identical.
# 4. **Running it**: the lesson starts itself under `mpiexec -n 2` (the `dist` extra: mpi4py and
#    MPICH); both ranks train the same MLP on their halves of each batch, rank 1 gets an
#    overflowing batch at one step, and the parent compares the two ranks' parameters. Without
#    mpi4py or mpiexec it says what it skipped.
#
# Assumes: nn.Graph and its IR (lesson 1), autograd (lesson 2), AMP (lesson 4), loss scaling and
# skipped steps (lesson 5).
#
# Run: `python tutorials/11_data_parallel.py [--out DIR]` (the 2-rank run takes about 20 s).

# %%
import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import miniflow as mf
from miniflow import distributed
from miniflow.amp import GradScaler
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.ir import grad_name
from miniflow.passes.data_parallel import DataParallelState
from miniflow.notebook import out_folder, script_args, script_dir

LESSON = script_dir(globals()) / "11_data_parallel.py"
DEFAULT_OUT = LESSON.parent.parent / "tutorial-output" / "11_data_parallel"
STEPS = 6
"""Training steps of the 2-rank run."""
OVERFLOW_STEP = 3
"""The step (from 1) at which rank 1's batch makes its float16 forward overflow."""


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def train_graph(bucket_cap_mb: float = 25.0) -> tuple:
    """An AMP training graph of a 64-32-10 MLP with a dynamic loss scale, data parallel."""
    mf.manual_seed(0)                                  # every rank starts from the same weights
    model = mlp((64, 32, 10))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    graph.config.enable_amp(True)
    scaler = GradScaler(init_scale=2.0 ** 10)
    graph.set_grad_scaler(scaler)
    graph.config.enable_data_parallel(True, bucket_cap_mb=bucket_cap_mb)
    return model, graph, scaler


def batch(step: int, rank: int) -> tuple:
    """Rank ``rank``'s half of the batch of ``step``: 8 rows of 64 pixels and their labels."""
    rng = np.random.default_rng(100 * step + rank)
    x = rng.uniform(0, 1, (8, 64)).astype(np.float32)
    if rank == 1 and step == OVERFLOW_STEP:
        x *= 6e4                    # 64 pixels of 6e4 times the weights: above 65504 in float16
    return x, rng.integers(0, 10, 8)


# %% [markdown]
# ## 1-2. The IR: all_reduce per bucket, and the summed non-finite count

# %%
def part1_ir() -> None:
    print("== 1. The data_parallel pass's all_reduce nodes (one process, the IR only) ==")
    _, graph, _ = train_graph(bucket_cap_mb=0.0005)  # 524-byte buckets: several, to see them
    graph(*batch(1, 0))
    lines = str(graph.ir).splitlines()
    shown = [ln for ln in lines if "all_reduce" in ln or "multi_count_not_finite" in ln
             or ("= cast(" in ln and "f32" in ln.split("=")[0] and "%" in ln)]
    print("IR lines of the gradient averaging and the non-finite count (AMP on, float16 "
          "gradients):")
    print(indent("\n".join(ln.strip() for ln in shown)))
    print("\n== 2. Buckets: per gradient dtype, in reverse parameter order, each closed once it "
          "holds bucket_cap_mb ==")
    for cap, g in ((0.0005, graph), (25.0, train_graph()[1])):
        if g is not graph:
            g(*batch(1, 0))
        buckets = g.compile_context.state[DataParallelState].buckets
        print(f"bucket_cap_mb={cap} ({cap * 2 ** 20:.0f} bytes): {len(buckets)} buckets, "
              f"{g.ir.count_ops().get('all_reduce', 0)} all_reduce nodes (one per bucket, one "
              f"for the non-finite counts)")
        for k, names in enumerate(buckets):
            grads = [g.ir.results[grad_name(n)] for n in names]
            size = sum(int(np.prod(v.shape)) * v.dtype.np.itemsize for v in grads)
            print(f"  bucket {k}: {names}, gradients {grads[0].dtype.short}, {size} bytes")
    print("\n== 3. Why the non-finite count is summed ==")
    print("the loss-scale pass counts the infs/NaNs of the averaged gradients "
          "(multi_count_not_finite) and all_reduces the counts with reduce='sum': every rank "
          "reads the same total, so every rank skips the same steps and halves its scale the "
          "same way. A rank deciding alone would update while another skips, and the replicas, "
          "which must stay identical, would drift apart for the rest of the run.")


# %% [markdown]
# ## 4. Two ranks under mpiexec

# %%
def rank_main(out: Path) -> None:
    """One rank of the ``mpiexec -n 2`` run: train, then save what the parent compares."""
    distributed.init()
    mf.set_backend("cpu")
    rank = distributed.rank()
    model, graph, scaler = train_graph()
    losses, skipped, scales = [], [], []
    for step in range(1, STEPS + 1):
        with np.errstate(over="ignore"):
            losses.append(float(graph(*batch(step, rank))))
        skipped.append(bool(scaler.found_inf))
        scales.append(scaler.scale)
    np.savez(out / f"rank{rank}.npz", losses=losses, skipped=skipped, scales=scales,
             **{k: v for k, v in model.state_dict().items()})


def find_mpiexec() -> str | None:
    """The ``mpiexec`` installed next to this Python (the ``mpich`` wheel), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def part4_two_ranks(out: Path) -> None:
    print(f"\n== 4. mpiexec -n 2: both ranks train {STEPS} steps; rank 1's batch overflows "
          f"float16 at step {OVERFLOW_STEP} ==")
    mpiexec = find_mpiexec()
    missing = ("mpi4py" if importlib.util.find_spec("mpi4py") is None else
               "mpiexec" if mpiexec is None else None)
    if missing:
        print(f"skipped the 2-rank run: {missing} is not installed (pip install -e '.[dist]' "
              f"installs mpi4py and MPICH's mpiexec); parts 1-3 above ran in one process")
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(mf.__path__[0]).resolve().parent)] + [p for p in [env.get("PYTHONPATH")] if p])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = "1"                   # two ranks on a small machine: one thread each
    cmd = [mpiexec, "-n", "2", sys.executable, str(LESSON), "--rank-of-mpi-run", "--out",
           str(out)]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                       timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"mpiexec -n 2 failed (exit {r.returncode}):\n{r.stdout}\n{r.stderr}")
    ranks = [np.load(out / f"rank{k}.npz") for k in range(2)]
    names = [k for k in ranks[0].files if k not in ("losses", "skipped", "scales")]
    same = all(np.array_equal(ranks[0][k], ranks[1][k]) for k in names)
    for k in range(2):
        print(f"  rank {k}'s loss per step: {' '.join(f'{v:.4g}' for v in ranks[k]['losses'])}")
    print(f"steps skipped by rank 0: {np.flatnonzero(ranks[0]['skipped']) + 1}, by rank 1: "
          f"{np.flatnonzero(ranks[1]['skipped']) + 1} (only rank 1's batch overflowed)")
    print(f"loss scale after each step, rank 0: "
          f"{' '.join(f'2^{np.log2(s):.0f}' for s in ranks[0]['scales'])}; equal on both "
          f"ranks: {np.array_equal(ranks[0]['scales'], ranks[1]['scales'])}")
    print(f"parameters and buffers of the two ranks after {STEPS} steps ({len(names)} tensors) "
          f"bit-identical: {same}")


# %%
def main() -> None:
    p = argparse.ArgumentParser(description="Lesson 11: data parallel training")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the ranks' files")
    p.add_argument("--rank-of-mpi-run", action="store_true",
                   help="internal: run as one rank under mpiexec (the lesson starts it)")
    args = p.parse_args(script_args())    # a notebook kernel passes its own arguments
    out_folder(p, args.out)
    if args.rank_of_mpi_run:
        rank_main(args.out)
        return
    mf.set_backend("cpu")
    part1_ir()
    part4_two_ranks(args.out)


if __name__ == "__main__":
    main()
