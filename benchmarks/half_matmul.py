"""Half-type matmuls on one core: each candidate of the tuner (``MINIFLOW_MATMUL=numba``: the
rules' Numba kernels; ``blas``: OpenBLAS on widened copies; ``packed``: the packed GEMM
(``kernels/cpu/packed_gemm.py``); ``mkl``: oneMKL's bf16 / f16 GEMM, on AMX where the CPU has
it, the ``amx`` extra) and the one the tuner picks (``auto``), for every product of the wide
MLP's training step at batch 1, 16, 64 and 256, in bfloat16 and float16 (out of the operands'
type, as AMP's products), against ``numpy.dot`` in float32 on the same shapes.

GFLOP/s from process CPU time, the cases' rounds interleaved (``kernels.interleaved_seconds``),
medians of ``--repeats``; one thread for Numba and BLAS. Without the extra, or on a CPU without
AMX-BF16 / AMX-FP16 / AVX512-FP16, the ``mkl`` column times the rules' steps again (nothing is
offered there). Writes ``benchmarks/results/half_matmul.json``.

    python benchmarks/half_matmul.py [--repeats 7] [--dtypes bf16,fp16] [--batches 1,16,64,256]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402
from kernels import WIDE, interleaved_seconds, mlp_products, plan_steps  # noqa: E402

CANDIDATES = ("numba", "blas", "packed", "mkl", "auto")
"""``MINIFLOW_MATMUL`` values timed (``auto``: the tuner's choice, measured when first built)."""


def _built(how: str, ins: list, shape: tuple, dtype, attrs: dict):
    """:func:`kernels.plan_steps` with ``MINIFLOW_MATMUL=how`` (``mkl`` without the extra:
    ``numba``, as forcing it would raise)."""
    from miniflow.kernels.cpu import mkl_gemm

    os.environ["MINIFLOW_MATMUL"] = "numba" if how == "mkl" and not mkl_gemm.available() else how
    try:
        return plan_steps("matmul", ins, [(shape, dtype)], attrs)
    finally:
        del os.environ["MINIFLOW_MATMUL"]


def rows(dtypes, batches, repeats: int) -> list:
    """One dict per product: its kernels per candidate and GFLOP/s per candidate and for
    ``numpy.dot`` in float32."""
    from miniflow.dtype import bfloat16, float16

    out = []
    for name in dtypes:
        dtype = {"bf16": bfloat16, "fp16": float16}[name].np
        for batch in batches:
            for label, m, k, n, ta, tb in mlp_products(WIDE, batch):
                r = np.random.default_rng(0)
                a = r.uniform(-1, 1, (k, m) if ta else (m, k)).astype(np.float32)
                b = r.uniform(-1, 1, (n, k) if tb else (k, n)).astype(np.float32)
                attrs = {"transpose_a": ta, "transpose_b": tb}
                ins = [a.astype(dtype), b.astype(dtype)]
                runs = [_built(how, ins, (m, n), dtype, attrs) for how in CANDIDATES]
                av, bv, o = (a.T if ta else a), (b.T if tb else b), np.empty((m, n), np.float32)
                runs.append(lambda: np.dot(av, bv, o))
                rates = [2.0 * m * k * n / t / 1e9 for t in interleaved_seconds(runs, repeats)]
                out.append({"dtype": name, "batch": batch, "product": label, "mkn": (m, k, n),
                            "kernels": {h: f.kernel for h, f in zip(CANDIDATES, runs)},
                            "gflops": dict(zip(CANDIDATES + ("numpy_dot",), rates))})
    return out


def table(res: list) -> str:
    """A Markdown table of :func:`rows`."""
    lines = ["| dtype | batch | product (m, k, n) | numba | blas | packed | mkl | auto (picked) | "
             "numpy.dot fp32 | auto / numba |", "|---|---:|---|---:|---:|---:|---:|---|---:|---:|"]
    for r in res:
        g = r["gflops"]
        picked = next((h for h in ("mkl", "packed", "blas") if r["kernels"]["auto"] ==
                       r["kernels"][h] and r["kernels"][h] != r["kernels"]["numba"]), "numba")
        lines.append(f"| {r['dtype']} | {r['batch']} | `{r['product']}` {r['mkn']} | "
                     f"{g['numba']:.1f} | {g['blas']:.1f} | {g['packed']:.1f} | {g['mkl']:.1f} | "
                     f"{g['auto']:.1f} ({picked}) | {g['numpy_dot']:.1f} | "
                     f"{g['auto'] / g['numba']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--dtypes", default="bf16,fp16")
    p.add_argument("--batches", default="1,16,64,256")
    args = p.parse_args(argv)
    print(harness.pin_threads(1))
    from miniflow.kernels.cpu import mkl_gemm
    print(f"machine: {harness.describe(harness.machine())}; load average before: "
          f"{harness.load_average():.2f}")
    print(mkl_gemm.describe())
    res = rows(args.dtypes.split(","), [int(b) for b in args.batches.split(",")], args.repeats)
    print(table(res))
    print(f"load average after: {harness.load_average():.2f}")
    harness.save_json("half_matmul", {"rows": res})


if __name__ == "__main__":
    main()
