"""Run by tests/test_tune.py under ``mpiexec -n N``: a matmul built on every rank with the
kernel tuner measuring (``MINIFLOW_MATMUL=auto``), each rank with a fake timer that would pick a
candidate of its own (rank 0: BLAS, the others: the Numba rules) and a tuning file of its own;
each rank writes what it chose, whether it timed anything and whether its file exists to
OUT/rank<r>.json."""
import json
import os
import sys
from pathlib import Path

import numpy as np

from miniflow import distributed as dist
from miniflow.dtype import float32
from miniflow.ir import Node, Value
from miniflow.kernels.cpu import builder_for, tune
from miniflow.ops import get_op

out = Path(sys.argv[1])
os.environ["MINIFLOW_MATMUL"] = "auto"
dist.init()
r = dist.rank()
timed = []


def timer(name, run):
    run()
    timed.append(name)
    costs = {"numba": 2e-3, "blas": 1e-3} if r == 0 else {"numba": 1e-3, "blas": 2e-3}
    return costs.get(name, 1.0)         # BLAS on one thread (more BLAS threads): slow here


path = out / f"tuning{r}.json"
tune.TUNER = tune.Tuner(path=str(path), timer=timer)
tune.begin_model(collective=True)       # as nn.Graph does for a data-parallel plan
a, b = np.ones((16, 300), np.float32), np.ones((1000, 300), np.float32)
node = Node(get_op("matmul"), [Value("a", a.shape, float32), Value("b", b.shape, float32)],
            [Value("o", (16, 1000), float32)], {"transpose_b": True})
steps = builder_for(node.op)(node, [a, b], [np.empty((16, 1000), np.float32)])
echo = dist.broadcast_object({"from": r}, "the test's object")
(out / f"rank{r}.json").write_text(json.dumps({
    "kernels": tune._kernels(steps), "timed": len(timed), "file": path.exists(),
    "choices": list(tune.TUNER.taken.values()), "echo": echo}))
