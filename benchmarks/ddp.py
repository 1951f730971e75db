"""Data-parallel training-step time at world size 2: miniflow (MPI, ``all_reduce`` nodes in the
graph) against PyTorch DDP (``DistributedDataParallel``, gloo backend).

Run it under MPI, one process per rank (PyTorch is the optional ``bench`` extra; without it only
the miniflow lines are printed)::

    mpiexec -n 2 python benchmarks/ddp.py [--repeats 5] [--models mlp,wide_mlp]
        [--batches 16,64] [--dtypes fp32,fp16]
    mpiexec -n 2 python benchmarks/ddp.py --models resnet50 --batches 16 [--image-size 224]

Models as ``speed.py``: ``mlp`` (64-128-10) and ``wide_mlp`` (64-1024-1024-10), Linear-ReLU-...-
Linear from ``speed.init_weights`` (both frameworks start from these weights), mean softmax
cross-entropy, SGD (``speed.LR``, momentum 0.9), fp32 or AMP fp16 (miniflow ``config.enable_amp()``
with ``speed.miniflow_step``'s dynamic scaler, PyTorch ``torch.autocast("cpu",
dtype=torch.float16)`` without one). Rank r trains on its own
fixed batch, rows ``[r * batch, (r + 1) * batch)`` of the digits training set, every step;
``batch`` is per rank (``input_shape``). The frameworks' mean first losses over the ranks are
checked to agree, and after timing every rank's weights are checked to be equal (both averaged
the gradients). ``resnet50``: ``benchmarks/resnet50.py``'s steps (``miniflow.models.resnet50``,
the torchvision-identical PyTorch model with the same initial weights, 1000 classes, SGD lr 0.01
momentum 0.9; its AMP has a dynamic loss scale on both sides) on a random batch per rank
(``input_shape=[B, 3, 224, 224]``); after timing the ranks' *parameters* are checked equal (the
batch-norm running statistics are each rank's own: PyTorch DDP broadcasts rank 0's buffers at
every forward, miniflow only when the graph compiles).

Threads: every pool (Numba, BLAS, OpenMP, PyTorch intra-op; PyTorch inter-op 1) gets
``cores // ranks on this machine`` threads, the same for both frameworks; MPICH busy-polls while a
rank waits, so ranks must not share cores.

Timing: warm-up steps (miniflow's first call compiles), then ``--repeats`` rounds of N steps per
framework, the frameworks alternating inside each round (the order rotates); a round starts with a
barrier and lasts as long as its slowest rank; the reported step time is the median round's time
/ N. Prints, per model, dtype and batch::

    miniflow mlp time: 0.120ms (= 12.0ms / 100, input_shape=[16, 64], ddp, world size=2)
    PyTorch mlp time: 1.532ms (= 153.2ms / 100, input_shape=[16, 64], ddp, world size=2)
    Relative speed: 12.77 (= 1.532ms / 0.120ms)

then the float16 bucket comparison (:func:`fp16_bucket`) and a Markdown table; rank 0 writes
``benchmarks/results/ddp.json`` (``--json PATH``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402
import resnet50 as rn  # noqa: E402
from speed import LABEL, MODELS, init_weights, miniflow_step, torch_step  # noqa: E402

ROUND_SECONDS = 0.2
"""Target duration of one framework's share of a round (sets N)."""
WORLD_SIZE = 2


def torch_ddp_step(sizes, weights, x, y, dtype: str, torch):
    """``speed.torch_step`` with the model in ``DistributedDataParallel``."""
    step = torch_step(sizes, weights, x, y, dtype,
                      wrap=torch.nn.parallel.DistributedDataParallel)
    step.weights = lambda: np.concatenate([p.detach().numpy().ravel()
                                           for p in step.model.parameters()])
    return step


def miniflow_ddp_step(sizes, weights, x, y, dtype: str):
    """``speed.miniflow_step``: under ``mpiexec -n 2`` its TrainGraph is data parallel."""
    step = miniflow_step(sizes, weights, x, y, dtype)
    step.weights = lambda: np.concatenate([a.ravel() for a in
                                           step.graph.model.state_dict().values()])
    return step


def resnet50_steps(frameworks, x, y, dtype: str, torch) -> dict:
    """ResNet-50 steps ``step()`` for the frameworks named in ``frameworks``, from the same
    weights, each with ``step.weights()`` (its parameters, flat) and ``step.model``."""
    mf_step, state = rn.miniflow_step("amp" if dtype == "fp16" else "fp32", None)
    steps = {"miniflow": (mf_step, lambda: np.concatenate([p.numpy().ravel() for p in
                                                           mf_step.model.parameters()]))}
    if "PyTorch" in frameworks:
        pt = rn.torch_step("amp" if dtype == "fp16" else "fp32", state,
                           wrap=torch.nn.parallel.DistributedDataParallel)
        steps["PyTorch"] = (pt, lambda: np.concatenate([p.detach().numpy().ravel()
                                                       for p in pt.model.parameters()]))
    out = {}
    for name, (fn, weights) in steps.items():
        def step(fn=fn):
            return fn(x, y)
        step.weights = weights
        out[name] = step
    return out


def init_torch(comm):
    """A gloo process group over the MPI ranks; rank 0's TCPStore takes a free port at once and
    mpi4py hands it to the others (no race for a port with other programs)."""
    import torch.distributed as tdist
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        store = tdist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False)
        comm.bcast(store.port, root=0)
    else:
        store = tdist.TCPStore("127.0.0.1", comm.bcast(None, root=0), size, is_master=False)
    tdist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    return tdist


def round_time(comm, fn, n: int) -> float:
    """Seconds of ``n`` calls of ``fn`` on the slowest rank, after a barrier."""
    from mpi4py import MPI
    comm.Barrier()
    return comm.allreduce(harness.round_time(fn, n), op=MPI.MAX)


def same_on_every_rank(comm, weights: np.ndarray) -> bool:
    gathered = comm.allgather(weights.tobytes())
    return all(g == gathered[0] for g in gathered)


def time_case(model, dtype, batch, data, frameworks, repeats, comm, image_size=224,
              torch=None) -> dict:
    """Median step times (seconds) and the N used, for every framework, on one case."""
    rank = comm.Get_rank()
    half = dtype != "fp32"
    if model == "resnet50":
        x, y = rn.data(batch, image_size, seed=rank)
        steps = resnet50_steps(frameworks, x, y, dtype, torch)
    else:
        sizes = MODELS[model]
        x = np.ascontiguousarray(data.x_train[rank * batch:(rank + 1) * batch])
        y = np.ascontiguousarray(data.y_train[rank * batch:(rank + 1) * batch])
        weights = init_weights(sizes)
        steps = {name: make(sizes, weights, x, y, dtype) for name, make in frameworks.items()}
    losses = {name: comm.allreduce(float(step())) / comm.Get_size()   # miniflow compiles here
              for name, step in steps.items()}
    first = losses["miniflow"]
    tol = 0.05 if half else 1e-4
    for name, loss in losses.items():
        if abs(loss - first) > tol * max(1.0, abs(first)):
            raise AssertionError(f"{model} {dtype} batch {batch}: first mean loss of {name} is "
                                 f"{loss}, miniflow's {first}: the frameworks differ")
    slowest = max(round_time(comm, step, 3) / 3 for step in steps.values())     # warm-up
    n = int(min(200, max(3, ROUND_SECONDS / slowest)))
    rounds = {name: [] for name in steps}
    names = list(steps)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rounds[name].append(round_time(comm, steps[name], n))
    for name, step in steps.items():
        if not same_on_every_rank(comm, step.weights()):
            raise AssertionError(f"{model} {dtype} batch {batch}: {name}'s ranks' weights differ "
                                 f"after training")
    return {"steps": n, "shape": list(x.shape), "first_mean_loss": losses,
            "total_s": {k: statistics.median(t) for k, t in rounds.items()},
            "step_s": {k: statistics.median(t) / n for k, t in rounds.items()},
            "rounds_s": rounds}


def fp16_bucket(comm, repeats: int) -> dict:
    """The two ways to average a float16 gradient bucket, timed on the wide MLP's float16 AMP
    gradients (every weight and hidden bias): the collective's own float16 path
    (``allreduce_mean_step``: NumPy widens, MPI sums float32, NumPy rounds) against what the
    ``data_parallel`` pass emits (``cast`` kernels to float32, a float32 ``all_reduce``, ``cast``
    back). Also checks that both give the same bits."""
    import miniflow as mf
    from miniflow import distributed
    from miniflow.ir import Graph
    from miniflow.ops import emitter
    from miniflow.runtime.plan import Plan

    shapes = [(10, 1024), (1024,), (1024, 1024), (1024,), (1024, 64)]
    rng = np.random.default_rng(comm.Get_rank())
    grads = [(rng.standard_normal(s) * 1e-2).astype(np.float16) for s in shapes]
    direct = [g.copy() for g in grads]
    fn, args = distributed.allreduce_mean_step(direct)

    g = Graph()
    emit = emitter(g)
    ins = [g.add_input(f"g{k}", s, mf.float16) for k, s in enumerate(shapes)]
    means = emit("all_reduce", *[emit("cast", v, dtype=mf.float32) for v in ins])
    g.set_outputs([emit("cast", m, dtype=mf.float16) for m in means])
    plan = Plan(g, mf.get_backend())
    for buf, a in zip(plan.input_buffers, grads):
        np.copyto(buf, a)

    def run_plan():
        for step, step_args in plan.steps:
            step(*step_args)

    timings = {}
    for name, call in (("float16 all_reduce", lambda: fn(*args)), ("casts + float32", run_plan)):
        call()
        rounds = [round_time(comm, call, 10) / 10 for _ in range(repeats)]
        timings[name] = statistics.median(rounds)
    fn(*args)                         # both once more from the same inputs: compare the bits
    for d, a in zip(direct, grads):
        np.copyto(d, a)
    fn(*args)
    run_plan()
    same = all(np.asarray(o).tobytes() == d.tobytes() for o, d in zip(plan.output_buffers, direct))
    return {"elements": int(sum(a.size for a in grads)), "step_s": timings, "same_bits": same}


def report(model: str, dtype: str, batch: int, res: dict) -> None:
    """The seed's output lines for one case."""
    for name, total in res["total_s"].items():
        print(f"{name} {model} time: {1e3 * total / res['steps']:.3f}ms (= {1e3 * total:.1f}ms / "
              f"{res['steps']}, input_shape={res['shape']}, ddp, world size={WORLD_SIZE}"
              f"{'' if dtype == 'fp32' else ', ' + LABEL[dtype]})")
    t = res["step_s"]
    if "PyTorch" in t:     # the seed's form: (= PyTorch's time / miniflow's)
        print(f"Relative speed: {t['PyTorch'] / t['miniflow']:.2f} (= {1e3 * t['PyTorch']:.3f}ms "
              f"/ {1e3 * t['miniflow']:.3f}ms)")
    sys.stdout.flush()


def table(results: list) -> str:
    """A Markdown table of every case (times in ms)."""
    rows = ["| model | dtype | batch per rank | miniflow | PyTorch DDP | PyTorch / miniflow |",
            "|---|---|---:|---:|---:|---:|"]
    for r in results:
        t = r["step_s"]
        torch_ms = f"{1e3 * t['PyTorch']:.3f}" if "PyTorch" in t else "-"
        rel = f"{t['PyTorch'] / t['miniflow']:.2f}" if "PyTorch" in t else "-"
        rows.append(f"| {r['model']} | {LABEL[r['dtype']]} | {r['batch']} | "
                    f"{1e3 * t['miniflow']:.3f} | {torch_ms} | {rel} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="rounds per case (median)")
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"of {', '.join(MODELS)}, resnet50 (default: the MLPs)")
    p.add_argument("--batches", default="16,64", help="batch sizes per rank")
    p.add_argument("--dtypes", default="fp32,fp16")
    p.add_argument("--image-size", type=int, default=224, help="resnet50's input size")
    p.add_argument("--json", default=str(harness.RESULTS / "ddp.json"),
                   help="where rank 0 writes the results (default benchmarks/results/ddp.json)")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    from mpi4py import MPI

    from miniflow import distributed
    from miniflow.data import load_digits

    comm = MPI.COMM_WORLD
    if comm.Get_size() != WORLD_SIZE:
        raise SystemExit(f"benchmarks/ddp.py: run it with mpiexec -n {WORLD_SIZE} (world size "
                         f"{comm.Get_size()})")
    distributed.init()
    threads = max(1, (os.cpu_count() or 1) // distributed.local_world_size())
    pools = harness.pin_threads(threads)
    frameworks = {"miniflow": miniflow_ddp_step}
    if torch is not None:
        init_torch(comm)
        frameworks["PyTorch"] = lambda *a: torch_ddp_step(*a, torch=torch)
    rank0 = comm.Get_rank() == 0
    data = load_digits()
    info = harness.machine()
    info.update(threads=pools, load_before=harness.load_average(), world_size=WORLD_SIZE)
    if rank0:
        print(f"machine: {harness.describe(info)}")
        print(f"threads per rank: {pools}; world size {WORLD_SIZE}, {os.cpu_count()} cores")
        if torch is None:
            print("PyTorch is not installed (pip install -e '.[bench]'): miniflow only")
        print(f"load average (1 min) before: {info['load_before']:.2f}; medians of "
              f"{args.repeats} alternating rounds")
    results = []
    for model in args.models.split(","):
        for dtype in args.dtypes.split(","):
            for batch in map(int, args.batches.split(",")):
                res = time_case(model, dtype, batch, data, frameworks, args.repeats, comm,
                                args.image_size, torch)
                results.append({"model": model, "dtype": dtype, "batch": batch, **res})
                if rank0:
                    report(model, dtype, batch, res)
    bucket = fp16_bucket(comm, args.repeats)
    info["load_after"] = harness.load_average()
    if rank0:
        t = bucket["step_s"]
        print(f"float16 gradient bucket of wide_mlp ({bucket['elements']:,} elements): "
              f"all_reduce in float16 {1e3 * t['float16 all_reduce']:.3f}ms, cast + float32 "
              f"all_reduce + cast {1e3 * t['casts + float32']:.3f}ms (the data_parallel pass's "
              f"choice); same bits: {bucket['same_bits']}")
        print(f"load average (1 min) after: {info['load_after']:.2f}")
        print()
        print(table(results))
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": info, "results": results, "fp16_bucket": bucket},
                                   indent=1))
        print(f"wrote {path}")
    if torch is not None:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
