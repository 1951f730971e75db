"""Run by tests/test_data_parallel.py under ``mpiexec -n N``: data-parallel training of the digits
MLP through nn.Graph. ``python training.py OUT MODE``; every rank writes OUT/rank<r>.json (and
.npz). Modes:

* ``equivalence``: 50 SGD-momentum steps, then (new model, new graph) 50 Adam steps, with a global
  batch of 64 split over the ranks by ``DistributedSampler`` (drop_last batches). Rank r > 0
  starts from other weights (seed 100 + r): the first compile must broadcast rank 0's. Writes the
  losses and every variable of both graphs; then rank 1 spoils its Adam moments, the learning
  rate changes (a recompile) and one more step runs: writes every variable again.
* ``overflow``: AMP with a dynamic GradScaler (rank 1 starts from another scale), 100 steps of
  32 rows per rank; at the steps in INJECT rank 1 alone puts 1e6 into its batch (inf in float16).
  Per step: found_inf, the scale, skipped steps and a digest of every variable.
* ``loop``: trains forever; writes OUT/pid<r>.json after the first step (the test kills a rank).
* ``raise``: rank 1 feeds an out-of-range label at step 3 (the kernel raises ValueError).
* ``mismatch``: rank 1's model is 64-64-10 instead of 64-128-10, then its batch has 31 rows
  instead of 32, then its lr is 0.2 instead of 0.1, then its lr becomes 5 after a step: writes
  the RankMismatchError every rank got.
* ``reload``: 6 SGD-momentum steps; a second graph takes 1 step elsewhere, then every rank loads
  the first graph's state dict of step 3 (a recompile on every rank) and takes steps 4 to 6:
  writes both runs' losses of steps 4 to 6 and whether every variable is equal.
* ``alone MODE``: 2 steps, then rank 1 alone makes its graph recompile (MODE ``load_state_dict``:
  loads the graph's state dict; ``dropout.p``: changes a traced module attribute; ``eval``:
  ``model.eval()``; ``eval again``: every rank has compiled an eval plan and gone back to
  train(), then rank 1 alone calls ``model.eval()``: its plan is compiled already, another than
  rank 0's) and every rank steps again: every rank raises RankMismatchError (uncaught: the job
  ends). Writes nothing.
* ``dropout SEEDS``: the MLP with a Dropout(0.5), 3 SGD steps on one batch the same on every
  rank, the dropout stream seeded ``7 + rank`` (SEEDS ``apart``) or 7 (``alike``) after the
  model: writes the losses, the stream's ``[seed, offset]`` and a digest of the first layer.
* ``tiny``: 4 AMP steps (dynamic GradScaler, Adam) of an 8-16-3 MLP on 6 random rows per rank,
  on the backend ``MINIFLOW_BACKEND`` names (the cuda lane runs it under the CUDA simulator):
  writes the losses, the scale and every variable.
"""
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np

import miniflow as mf
from miniflow import distributed as dist
from miniflow.data import DistributedSampler, batches, load_digits
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.passes.data_parallel import DataParallelState

out, mode = Path(sys.argv[1]), sys.argv[2]
dist.init()
rank, size = dist.rank(), dist.world_size()
data = load_digits()
GLOBAL_BATCH = 64
INJECT = (7, 23, 24, 51, 80)


def model_for_rank(sizes=(64, 128, 10)):
    mf.manual_seed(0 if rank == 0 else 100 + rank)      # other ranks start elsewhere
    return mlp(sizes)


def stream(batch, seed=3):
    """This rank's batches, epoch after epoch (the global batch k is the same for any world)."""
    sampler = DistributedSampler(data.x_train, seed=seed)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from batches(data.x_train, data.y_train, batch, sampler=sampler, drop_last=True)
        epoch += 1


def variables(graph):
    ir = graph.ir
    return {name: np.array(ir.variable_data[name]) for name in sorted(ir.variables)}


def digest(graph, prefix=""):
    """SHA-256 of the graph's variables whose names start with ``prefix``."""
    h = hashlib.sha256()
    for name, a in variables(graph).items():
        if name.startswith(prefix):
            h.update(name.encode() + a.tobytes())
    return h.hexdigest()


def save(info, arrays=None):
    (out / f"rank{rank}.json").write_text(json.dumps(info))
    if arrays is not None:
        np.savez(out / f"rank{rank}.npz", **arrays)


if mode == "equivalence":
    info, arrays = {"world_size": size}, {}
    for name, make in (("sgd", lambda p: mf.optim.SGD(p, lr=0.1, momentum=0.9)),
                       ("adam", lambda p: mf.optim.Adam(p, lr=0.01))):
        model = model_for_rank()
        opt = make(model.parameters())
        graph = TrainGraph(model, opt)
        data_stream = stream(GLOBAL_BATCH // size)
        info[f"{name}_losses"] = [float(graph(*next(data_stream))) for _ in range(50)]
        reduced = graph.compile_context.state.get(DataParallelState)   # None: one rank
        info[f"{name}_buckets"] = reduced.buckets if reduced is not None else []
        arrays.update({f"{name}/{k}": v for k, v in variables(graph).items()})
    if rank == 1:        # spoil this rank's Adam state; the recompile gives it rank 0's again
        for k, v in graph.ir.variable_data.items():
            if k.endswith(".exp_avg"):
                v[...] = 1.0
    opt.param_groups[0]["eps"] = 1e-7  # an attribute of the update op: the graph recompiles
    graph(*next(data_stream))           # (a new lr would not: it is a graph variable)
    info["compile_count"] = graph.compile_count
    arrays.update({f"resync/{k}": v for k, v in variables(graph).items()})
    local = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    local.config.enable_data_parallel(False)          # every rank trains on its own
    local(*next(data_stream))
    info["local_all_reduce_nodes"] = local.ir.count_ops().get("all_reduce", 0)
    save(info, arrays)

elif mode == "overflow":
    model = model_for_rank()
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    graph.config.enable_amp()
    scaler = mf.amp.GradScaler(init_scale=2.0 ** 16 if rank == 0 else 2.0 ** 10,
                               growth_interval=10)
    graph.set_grad_scaler(scaler)
    data_stream = stream(32)
    steps = []
    for step in range(100):
        x, y = next(data_stream)
        if rank == 1 and step in INJECT:
            x = x.copy()
            x[0, 0] = 1e6
        graph(x, y)
        steps.append({"found_inf": scaler.found_inf, "scale": scaler.scale,
                      "skipped": scaler.num_skipped_steps, "all": digest(graph),
                      "model": digest(graph, "model.")})    # parameters and momentum buffers
    save({"steps": steps, "inject": INJECT, "ir": str(graph.ir)})

elif mode == "loop":
    model = model_for_rank()
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.01))
    data_stream = stream(32)
    graph(*next(data_stream))
    (out / f"pid{rank}.json").write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid()}))
    while True:
        graph(*next(data_stream))

elif mode == "raise":
    model = model_for_rank()
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.01))
    data_stream = stream(32)
    for step in range(10):
        x, y = next(data_stream)
        if rank == 1 and step == 3:
            y = y.copy()
            y[5] = 12
        graph(x, y)
    save({"finished": True})

elif mode == "mismatch":
    errors = {}
    model = model_for_rank((64, 64, 10) if rank == 1 else (64, 128, 10))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.01))
    x, y = data.x_train[:32], data.y_train[:32]
    try:
        graph(x, y)
    except dist.RankMismatchError as e:
        errors["parameters"] = str(e)
    model = model_for_rank()
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.01))
    n = 31 if rank == 1 else 32
    try:
        graph(x[:n], y[:n])
    except dist.RankMismatchError as e:
        errors["batch"] = str(e)
    model = model_for_rank()
    opt = mf.optim.SGD(model.parameters(), lr=0.1 * (1 + rank))
    try:
        TrainGraph(model, opt)(x, y)
    except dist.RankMismatchError as e:
        errors["lr"] = str(e)
    opt = mf.optim.SGD(model.parameters(), lr=0.1)
    graph = TrainGraph(model, opt)
    graph(x, y)
    if rank == 1:
        opt.param_groups[0]["lr"] = 5.0
    try:
        graph(x, y)
    except dist.RankMismatchError as e:
        errors["lr later"] = str(e)
    save(errors)
elif mode == "reload":
    sgd = lambda m: mf.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)   # noqa: E731
    data_stream = stream(32)
    steps = [next(data_stream) for _ in range(6)]
    model = model_for_rank()
    whole = TrainGraph(model, sgd(model))
    for x, y in steps[:3]:
        whole(x, y)
    state = whole.state_dict()
    losses = [float(whole(x, y)) for x, y in steps[3:]]
    model = model_for_rank()
    again = TrainGraph(model, sgd(model))
    again(*steps[0])                     # compiled, and elsewhere
    again.load_state_dict(state)         # on every rank: every rank recompiles
    save({"whole": losses, "again": [float(again(x, y)) for x, y in steps[3:]],
          "same": digest(whole) == digest(again), "compile_count": again.compile_count})
elif mode == "alone":
    model = mf.nn.Sequential(*model_for_rank(), mf.nn.Dropout(0.1))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    data_stream = stream(32)
    for _ in range(2):
        graph(*next(data_stream))
    change = sys.argv[3]
    if change == "eval again":          # every rank: an eval plan compiled, then train again
        model.eval()
        graph(*next(data_stream))
        model.train()
        graph(*next(data_stream))
    if rank == 1:
        if change == "load_state_dict":
            graph.load_state_dict(graph.state_dict())
        elif change == "dropout.p":
            model[-1].p = 0.2
        else:
            model.eval()
    graph(*next(data_stream))
    save({"finished": True})
elif mode == "tiny":
    model = model_for_rank((8, 16, 3))
    graph = TrainGraph(model, mf.optim.Adam(model.parameters(), lr=0.01))
    graph.config.enable_amp()
    scaler = mf.amp.GradScaler(init_scale=2.0 ** 16, growth_interval=2)
    graph.set_grad_scaler(scaler)
    rows = np.random.default_rng(0).uniform(-1, 1, (6 * size, 8)).astype(np.float32)
    x = np.ascontiguousarray(rows[6 * rank:6 * rank + 6])
    y = np.arange(6 * rank, 6 * rank + 6, dtype=np.int64) % 3
    losses, scales = [], []
    for _ in range(4):
        losses.append(float(graph(x, y)))
        scales.append(scaler.scale)
    save({"losses": losses, "scales": scales, "backend": mf.get_backend().name},
         variables(graph))
elif mode == "dropout":
    seeds = sys.argv[3]            # "apart": rank r seeds 7 + r (nanoGPT's); "alike": 7 on all
    model = model_for_rank()
    model = mf.nn.Sequential(model[0], model[1], mf.nn.Dropout(0.5), model[2])
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    mf.manual_seed(7 + (rank if seeds == "apart" else 0))
    x, y = data.x_train[:32], data.y_train[:32]       # one batch, the same on every rank
    losses = [float(graph(x, y)) for _ in range(3)]
    stream = model[2].rng_state.numpy().tolist()
    save({"losses": losses, "stream": stream, "weights": digest(graph, "0.")})
else:
    raise SystemExit(f"unknown mode {mode!r}")
