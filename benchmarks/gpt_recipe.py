"""The GPT recipe of ``miniflow train --model gpt`` (``miniflow.experiments.train_gpt.GPT_DEFAULTS``)
against issue 25's target: a validation loss at most half of the unigram model's within 10
minutes on 2 cores, float32 and AMP float16 within 3% of each other.

Runs ``train_gpt`` with the defaults (or the given overrides) in this process and prints one JSON
line: the validation loss after every epoch, its ratio to the unigram loss, the steps, the
process's CPU time (``time.process_time``: every thread's CPU seconds, compilation, data and
evaluation included), the wall time and the load average.

The wall time on idle cores is derived from the CPU time, not measured (on a shared machine the
wall time measures the other users): the run is compute bound (no I/O after the corpus is read),
so on idle cores at least one of its threads runs at every moment and its wall time is at most its
CPU time; with its 2 threads it is at least half of it. ``idle_wall_bound_s`` prints that bound
(the CPU time) and ``steps_per_cpu_s`` the steps per CPU second, a lower bound of the steps per
second on the idle machine. Both are conservative: contention inflates the CPU time (cache
misses, the thread pool's waits).

Usage: ``python benchmarks/gpt_recipe.py [--amp fp16|bf16] [--epochs N] [--steps-per-epoch N]``.
"""
from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--amp", choices=("fp16", "bf16"), default=None)
    p.add_argument("--epochs", type=int)
    p.add_argument("--steps-per-epoch", type=int)
    args = p.parse_args()
    from miniflow.experiments.train_gpt import train_gpt
    given = {k: v for k, v in dict(amp=args.amp, epochs=args.epochs,
                                   steps_per_epoch=args.steps_per_epoch).items() if v is not None}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    r = train_gpt(progress=False, report=lambda line: print(line, flush=True), **given)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"settings": given or "defaults", "val_losses": r["val_losses"],
                      "unigram": r["unigram"], "ratio": r["val_losses"][-1] / r["unigram"],
                      "steps": r["steps"], "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
                      "idle_wall_bound_s": round(cpu, 1),
                      "steps_per_cpu_s": round(r["steps"] / cpu, 2),
                      "load_average": os.getloadavg()}))


if __name__ == "__main__":
    main()
