"""Run by tests/test_distributed.py under ``mpiexec -n N``: every collective step on arrays that
differ per rank; each rank writes its inputs and results to OUT/rank<r>.npz and a summary to
OUT/rank<r>.json."""
import json
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from miniflow import distributed as dist

out = Path(sys.argv[1])
dist.init()
r, n = dist.rank(), dist.world_size()
rng = np.random.default_rng(1000 + r)
saved, info = {}, {"rank": r, "world_size": n}


def keep(prefix, arrays):
    for i, a in enumerate(arrays):
        saved[f"{prefix}{i}"] = a.copy()


# float buckets of several arrays (staged), one array alone (in place), and odd sizes
shapes = [(3, 5), (7,), (1,), (0,), (1000,)]
buckets = {
    "f32": [rng.standard_normal(s).astype(np.float32) for s in shapes],
    "f64": [rng.standard_normal(s) for s in shapes],
    "f32_alone": [rng.standard_normal((4, 33)).astype(np.float32)],
    "f64_alone": [rng.standard_normal(257)],
}
f16 = [(rng.standard_normal(s) * 3).astype(np.float16) for s in shapes]
# float16 edge cases: sums beyond 65504 (float16 addition would overflow), subnormals,
# round-to-nearest-even ties of the float32 mean, inf and nan on one rank only
f16.append(np.array([60000 + 2000 * r, -65504, 2.0 ** -24 * (r + 1), 2.0 ** -14 * (2 * r + 1),
                     1 + 2.0 ** -10 * r, np.inf if r == 1 else 1.0,
                     np.nan if r == 0 else 2.0], np.float16))
buckets["f16"] = f16
buckets["f16_alone"] = [(rng.standard_normal(100) * 1000).astype(np.float16)]
for name, arrays in buckets.items():
    keep(f"in_{name}_", arrays)
    fn, args = dist.allreduce_mean_step(arrays)
    fn(*args)
    keep(f"out_{name}_", arrays)
    info[f"step_name_{name}"] = fn.__name__

# gradients allocated as views of one bucket buffer: reduced there, with no staging buffer
for name, dt in (("f32_views", np.float32), ("f64_views", np.float64)):
    flat = rng.standard_normal(1 + 15 + 7 + 100_000).astype(dt)
    views = [flat[1:16].reshape(3, 5), flat[16:23], flat[23:23], flat[23:]]
    keep(f"in_{name}_", views)
    first = float(flat[0])                  # outside the bucket: must stay as it is
    tracemalloc.start()
    fn, args = dist.allreduce_mean_step(views)
    info[f"build_peak_bytes_{name}"] = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    fn(*args)
    keep(f"out_{name}_", views)
    info[f"outside_kept_{name}"] = float(flat[0]) == first

# the same into separate outputs: the inputs are only read
for name in ("f32", "f32_alone", "f16"):
    src = [rng.standard_normal(a.shape).astype(a.dtype) for a in buckets[name]]
    dst = [np.full_like(a, -7) for a in src]
    keep(f"in_{name}_into_", src)
    fn, args = dist.allreduce_mean_step(src, out=dst)
    fn(*args)
    keep(f"out_{name}_into_", dst)
    keep(f"unchanged_{name}_into_", src)

# buckets planned by compute_bucket_assignment_by_size with a tiny cap: several steps
grads = [rng.standard_normal(s).astype(dt) for s, dt in
         [((40,), np.float32), ((10, 3), np.float16), ((50,), np.float32), ((2,), np.float16),
          ((8,), np.float64), ((30,), np.float32)]]
plan = dist.compute_bucket_assignment_by_size([(g.shape, g.dtype) for g in grads],
                                              bucket_cap_mb=200 / 2 ** 20)
info["bucket_plan"] = plan
keep("in_grad_", grads)
steps = [dist.allreduce_mean_step([grads[i] for i in bucket]) for bucket in plan]
for fn, args in steps:
    fn(*args)
keep("out_grad_", grads)

# the non-finite count
counts = np.array([r + 1, -r, 2 ** 40 * r, 7], np.int64)
saved["in_count"] = counts.copy()
fn, args = dist.allreduce_sum_int64_step(counts)
fn(*args)
saved["out_count"] = counts.copy()
into = np.zeros_like(counts)
fn, args = dist.allreduce_sum_int64_step(saved["in_count"], out=into)
fn(*args)
saved["out_count_into"], saved["in_count_into"] = into, saved["in_count"]
pair = [np.array([r, 2 * r + 1], np.int64), np.array([10 + r], np.int64)]   # staged: 2 arrays
keep("in_countpair_", pair)
fn, args = dist.allreduce_sum_int64_step(pair)
fn(*args)
keep("out_countpair_", pair)
info["step_name_countpair"] = fn.__name__
info["local_world_size"] = dist.local_world_size()

# broadcast from rank 0 and from the last rank, any dtype
bc = [np.full((2, 3), r, np.float32), np.arange(5, dtype=np.float16) + r,
      np.array([r, -r], np.int64), np.array([[r % 2 == 0]]), np.zeros(0, np.float32)]
fn, args = dist.broadcast_step(bc, root=0)
fn(*args)
keep("bcast0_", bc)
bc_last = [np.full(4, 10.0 * r)]
fn, args = dist.broadcast_step(bc_last, root=n - 1)
fn(*args)
keep("bcastlast_", bc_last)

# no array allocated per call: 4 MiB float32 bucket and 2 MiB float16 bucket, staged
big = [np.full(1 << 19, r, np.float32), np.full(1 << 19, 1.0, np.float32)]
big16 = [np.full(1 << 20, r, np.float16)]
big_steps = [dist.allreduce_mean_step(big), dist.allreduce_mean_step(big16),
             dist.allreduce_sum_int64_step(counts), dist.broadcast_step(big)]
for fn, args in big_steps:
    fn(*args)
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
for _ in range(5):
    for fn, args in big_steps:
        fn(*args)
info["alloc_peak_bytes"] = tracemalloc.get_traced_memory()[1] - base
tracemalloc.stop()
info["big_mean"] = float(big[0][0]), float(big16[0][0])

# the same signature everywhere passes
dist.check_same_across_ranks("fc.weight f32[10, 64]\nfc.bias f32[10]", "parameters")

# barrier: rank 0 works 1 s; the others wait, sleeping
dist.barrier()
t0, u0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
if r == 0:
    time.sleep(1.0)
dist.barrier()
u1 = resource.getrusage(resource.RUSAGE_SELF)
info["barrier_wait_s"] = time.monotonic() - t0
info["barrier_cpu_s"] = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)

np.savez(out / f"rank{r}.npz", **saved)
(out / f"rank{r}.json").write_text(json.dumps(info))
