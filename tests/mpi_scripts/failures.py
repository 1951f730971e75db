"""Run by tests/test_distributed.py under ``mpiexec -n 2``: the failure modes. ``MODE`` is
``raise`` (rank 1 raises while rank 0 waits in a collective), ``loop`` (every rank writes its pid
and parent pid to OUT/pid<r>.json, then all-reduces forever: the test kills one), ``early_exit``
(rank 1 leaves with sys.exit(0) while rank 0 waits: the collective timeout, set to 3 s by a second
``init``, ends it), ``abort`` (rank 1 calls ``abort(3)`` while rank 0 waits) or ``mismatch`` (the ranks' parameter lists differ: every rank writes the error
it got)."""
import json
import os
import sys
from pathlib import Path

import numpy as np

from miniflow import distributed as dist

out, mode = Path(sys.argv[1]), sys.argv[2]
dist.init()
if mode == "early_exit":
    dist.init(timeout=3.0)                  # a later call sets the timeout
r = dist.rank()
grad = np.full(4, float(r), np.float32)
fn, args = dist.allreduce_mean_step([grad])
fn(*args)                                   # every rank is up and connected

if mode == "raise":
    if r == 1:
        raise ValueError("injected failure on rank 1")
    fn(*args)                               # waits for rank 1 forever without the excepthook
elif mode == "loop":
    (out / f"pid{r}.json").write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid()}))
    while True:
        fn(*args)
elif mode == "early_exit":
    if r == 1:
        sys.exit(0)
    fn(*args)
elif mode == "abort":
    if r == 1:
        dist.abort(3)
    fn(*args)
elif mode == "mismatch":
    params = ["0.weight f32[128, 64]", "0.bias f32[128]", "2.weight f32[10, 128]", "2.bias f32[10]"]
    cases = {"same": params,
             "item": params[:2] + ["2.weight f32[10, 256]"] + params[3:] if r == 1 else params,
             "more": params + ["4.weight f32[5, 10]"] if r == 1 else params,
             "fewer": params[:3] if r == 1 else params}
    errors = {}
    for case, signature in cases.items():
        try:
            dist.check_same_across_ranks("\n".join(signature), "parameters of graph TrainGraph")
        except dist.RankMismatchError as e:
            errors[case] = str(e)
    (out / f"rank{r}.json").write_text(json.dumps(errors))
