"""Every tutorial runs as a student runs it (a subprocess, ``--quick`` where it has one), exits 0,
and still prints the fact it exists to teach: a lesson whose story breaks fails here, not only one
that crashes.

Each case lists regular expressions that must match the output, and checks that every figure the
lesson says it wrote exists. ``NUMBA_CACHE_DIR`` is passed through (CI sets it), so the kernels
compiled by the test suite are reused.
"""
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every lesson in a subprocess (-m "not slow" skips them)

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
TIMEOUT_S = 180
"""Per lesson; the budget is 60 s on a 2-core CPU, the rest is slack for a cold Numba cache."""
HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None


def _accuracy_at_least(pct: float):
    def check(out: str):
        m = re.search(r"test accuracy \(AMP\): ([\d.]+)%", out)
        assert m and float(m.group(1)) >= pct, f"AMP test accuracy below {pct}%: {m and m.group(0)}"
    return check


CASES = {
    "01_lazy_graph.py": ([], [
        r"compile_count after 2 calls with the same input shape: 1\n",
        r"compile_count after a call with a batch of 5: 2\n",
        r"compile_count after calling with the batch of 8 again: 2 ",
        r"eager model\(batch\) vs the graph's output, max \|difference\|: 0 ",
    ]),
    "02_graph_autograd.py": (["--out"], [
        r"backward node types, in order: \['ones_like', .*'add_n', 'tanh_grad', 'matmul'\]",
        r"max \|graph dL/dw - central finite differences \(eps=1e-06\)\|: \d\.\d+e-(0[7-9]|1\d)\n",
        r"finite-difference check: (\d+) of \1 ops agree",
    ]),
    "03_numba_kernels.py": (["--quick", "--out"], [
        r"graph output equals the kernel called by hand: True",
        r"float16 kernel \(uint16 views, float32 math\) vs .*: 100\.0% bit-identical",
        r"\[cuda child\] hand-written CUDA kernel matches NumPy .*: True",
    ] + ([r"\[cuda child\] miniflow cuda backend sigmoid matches NumPy .*: True"]
         if HAS_NUMBA_CUDA else [])),
    "04_amp_pass.py": (["--out"], [
        r"step 1b, walk DOWN from black nodes .* = the BLACK set: 5 nodes",
        r"AMP: 9 float16 nodes, 9 float32 nodes, 6 inserted casts",
        r"AMP report counts without the identity: 18 float16 nodes, 0 float32 nodes",
        r"DOT file written to: ",
    ]),
    "05_loss_scaling.py": (["--quick", "--out"], [
        r"float16 cast of gradient x 2\^0 : +[1-9][\d.]*% zero",
        r"policy legacy +\| static 2\^17, no skip \(OneFlow\) +: weights NaN after step 1, "
        r"loss NaN from step 2, skipped 0/",
        r"policy cast_back +\| static 2\^17, no skip \(OneFlow\) +: weights NaN after step 1,",
        r"policy legacy +\| static 2\^17, skip \(miniflow\) +: skipped +(\d+)/\1 steps",
        r"policy cast_back +\| static 2\^17, skip \(miniflow\) +: skipped +(\d+)/\1 steps",
        r"policy fp32 +\| static 2\^17, skip \(miniflow\) +: skipped +0/",
        r"OneFlow never skips under a static scale",
        r"policy legacy +\| dynamic .*largest scale of an applied step +2\^15,",
        r"policy 'fp32': initial gradient %\d+ is f32",
    ]),
    "06_gray_node_control.py": (["--quick"], [
        r"gray node bwd  tanh grad +f16 white +f32 black",
        r"training with white\(loss\) +: .*largest applied scale 2\^15,.*a float16 number: True",
        r"placement none +: skipped +(\d+)/\1 steps, initial gradient f16",
        r"placement black\(logits\) +: skipped +0/\d+ steps, initial gradient f32",
    ]),
    "07_train_digits.py": (["--quick", "--no-progress", "--out"], [
        _accuracy_at_least(90.0),
        r"loss scale: started 2\^16, final 2\^\d+, skipped steps \d+ of 115",
    ]),
}


def test_every_tutorial_is_tested_and_listed_in_the_readme():
    scripts = sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*.py"))
    assert scripts == sorted(CASES)
    readme = (TUTORIALS / "README.md").read_text()
    assert all(f"python tutorials/{s}" in readme for s in scripts)


@pytest.mark.parametrize("script", sorted(CASES))
def test_tutorial_runs_and_prints_its_key_fact(script, tmp_path):
    flags, checks = CASES[script]
    args = []
    for flag in flags:
        args += ["--out", str(tmp_path)] if flag == "--out" else [flag]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["MPLBACKEND"] = "Agg"
    env.pop("MINIFLOW_BACKEND", None)
    # The lessons' matmuls are tiny: BLAS threads only add contention on a small, busy runner.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(TUTORIALS / script), *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = time.perf_counter() - t0
    out = r.stdout
    assert r.returncode == 0, f"{script} exited {r.returncode} after {wall:.0f} s:\n" \
                              f"{out[-3000:]}\n{r.stderr[-3000:]}"
    for check in checks:
        if callable(check):
            check(out)
        else:
            assert re.search(check, out), \
                f"{script}: no line matches {check!r}; output:\n{out[-4000:]}"
    for path in re.findall(r"written to: (\S+)", out):
        assert Path(path).exists(), f"{script} says it wrote {path}, which does not exist"
        assert Path(path).is_relative_to(tmp_path), f"{script} wrote {path} outside --out"
