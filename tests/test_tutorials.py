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
import shutil
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
HAS_MPI = importlib.util.find_spec("mpi4py") is not None and (
    (Path(sys.executable).parent / "mpiexec").exists() or shutil.which("mpiexec") is not None)


def _accuracy_at_least(pct: float):
    def check(out: str):
        m = re.search(r"test accuracy \(AMP\): ([\d.]+)%", out)
        assert m and float(m.group(1)) >= pct, f"AMP test accuracy below {pct}%: {m and m.group(0)}"
    return check


def _kernel_checks(backend: str, label: str = ""):
    """Lesson 8's sample checks on ``backend``: both ops, all three dtypes, all within tolerance."""
    def check(out: str):
        found = re.findall(rf"^{re.escape(label)}{backend} kernel of (lesson08_softplus(?:_grad)?) +"
                           rf"(float\d+): \d+ samples, .*within tolerance: (\w+)$", out, re.M)
        assert sorted((op, dt) for op, dt, _ in found) == sorted(
            (op, dt) for op in ("lesson08_softplus", "lesson08_softplus_grad")
            for dt in ("float16", "float32", "float64")), f"{backend} sample checks: {found}"
        assert all(ok == "True" for _, _, ok in found), f"{backend} sample checks: {found}"
    return check


def _lesson8_accuracy(out: str):
    m = re.search(r"MLP with Softplus, AMP on, \d+ epochs .*test accuracy ([\d.]+)%", out)
    assert m and float(m.group(1)) >= 85.0, f"softplus MLP accuracy: {m and m.group(0)}"


def _lenet_accuracy(out: str):
    m = re.search(r"LeNet test accuracy \(AMP\): ([\d.]+)%", out)
    assert m and float(m.group(1)) >= 90.0, f"LeNet AMP accuracy: {m and m.group(0)}"


def _cse_in_nn_graph(out: str):
    m = re.search(r"trained 5 steps on loss = sum\(y \* y\): (\d+) nodes without CSE, (\d+) with; "
                  r"losses bit-identical: True, parameters bit-identical: True", out)
    assert m and int(m.group(2)) < int(m.group(1)), f"CSE inside nn.Graph: {m and m.group(0)}"


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
    "08_add_an_op.py": ([], [
        r"registered: OpDef\('lesson08_softplus'\) and OpDef\('lesson08_softplus_grad'\); .* "
        r"AMP list 'gray', writes \(\)\n",
        r"no AMP list and no note -> ValueError: op 'lesson08_softplus_nolist' is in no AMP list",
        r"another function named lesson08_softplus -> ValueError: .*clashes with another function",
        r"the library's own op 'softplus' is declared the same way, with scalar attributes "
        r"\('beta', 'threshold'\) \(defaults \{'beta': 1\.0, 'threshold': 20\.0\}\): "
        r"softplus\(x, beta, threshold\)",
        r"lesson08_softplus vs the library's softplus \(beta=1\.0, threshold=20\.0\), float32 "
        r"over \[-30, 30\]: max \|difference\| (0\.0e\+00|\d\.\de-0[6-9])",
        r"lesson08_softplus of an int64 input -> TypeError: lesson08_softplus: input %labels "
        r"\(i64\[4\]\) must be floating point",
        r"'lesson08_softplus' in miniflow\.kernels\.cpu\.KERNELS: False",
        r"the float32 plan's step: map_kernel\.<locals>\.kernel from miniflow\.kernels\.cpu\.",
        _kernel_checks("cpu"),
        r"the autograd pass emitted, .*'lesson08_softplus_grad'\]",
        r"check_grad\('lesson08_softplus'\): max \|rule - central finite differences\| = "
        r"\d\.\de-(0[89]|1\d) .*agrees",
        _lesson8_accuracy,
        r"lesson08_softplus +%\d+ +color white +dtype f16",
        r"fused expression 'lesson08_softplus\(add\(x0, x1\)\)'",
        r"from __main__ import lesson08_softplus",
        r"Predict's plan vs ir\.evaluate of its IR \(float64\), max \|difference\|: "
        r"\d\.\de-(0[5-9]|1\d)",
        r"after ops\.unregister: 'lesson08_softplus' in all_ops\(\): False, in "
        r"scalar_functions\(\): False",
    ] + ([r"\[cuda child\] 'lesson08_softplus' in miniflow\.kernels\.cuda\.KERNELS: False; "
          r"cuda\.builder_for\(op\) derived: True",
          _kernel_checks("cuda", "  [cuda child] "),
          r"\[cuda child\] the float32 plan on the cuda backend: .*map\[lesson08_softplus\] f32"]
         if HAS_NUMBA_CUDA else [])),
    "09_write_a_pass.py": ([], [
        r"CSE on the forward graph: 14 -> 12 nodes",
        r"ir\.evaluate before vs after CSE \(float64\): loss .*, equal: True",
        r"pipeline with CSE, nodes after each pass: autograd 30, "
        r"common_subexpression_elimination 27,",
        r"nodes CSE removed right after autograd, per op: \{'matmul': 1, 'tanh': 1, "
        r"'broadcast_mul': 1\}",
        r"loss bit-identical: True, dL/dw bit-identical: True",
        _cse_in_nn_graph,
        r"with update ops: 2 sgd_update nodes kept, 2 tanh\(w\) nodes kept .*new w equal: True, "
        r"tanh\(w\) after the updates equal: True",
        r"cse_forgetting_readers: VerifyError: node 3 \(tanh\): input %\?\d+ is defined nowhere "
        r"in the graph",
        r"cse_ignoring_attributes on reduce_sum over axis 0 and 1: VerifyError: node \d+ "
        r"\(broadcast_mul\): op inference failed: .*cannot be broadcast",
        r"cse_ignoring_attributes on sum\(2 t\) \+ sum\(3 t\): verify\(\) passed, ir\.evaluate "
        r"gives ([\d.]+) instead of (?!\1)[\d.]+",
        r"the correct pass on the same graph: [\d.]+, 2 scalar_mul nodes kept",
    ]),
    "10_convnets_under_amp.py": (["--quick", "--out"], [
        r"weight \[4, 18\] @ cols \[18, 25\] reshaped to \[1, 4, 5, 5\] vs the conv2d plan's "
        r"output, max \|difference\|: 0\.0e\+00",
        r"\(16 multiplies\), max \|difference\|: \d\.\de-1[4-7]",
        r"the plan uses Winograd: True",
        r"max \|Winograd plan - float64 reference\| \d\.\de-0[6-8]",
        r"float32 reaches 1\.0030, float16 stays at 1\.0000",
        r"the block alone: 1 float16 nodes, 3 float32 nodes",
        r"normalization %\d+ reads %model\.1\.running_mean \(moving_mean, input 1\) as f32",
        r"5 of 5 conv2d/conv_\*_grad nodes in float16",
        _lenet_accuracy,
    ]),
    "11_data_parallel.py": (["--out"], [
        r"%\d+: f32\[10,32\] = all_reduce\(%\d+\) \{reduce='mean'\}",
        r"%\d+: i64\[4\], %\d+: i64\[1\] = all_reduce\(%\d+, %\d+\) \{reduce='sum'\}",
        r"bucket_cap_mb=0.0005 \(524 bytes\): 3 buckets, 4 all_reduce nodes",
        r"bucket 2: \['model.0.bias', 'model.0.weight'\], gradients f16, 4160 bytes",
    ] + ([r"steps skipped by rank 0: \[3\], by rank 1: \[3\]",
          r"equal on both ranks: True",
          r"parameters and buffers of the two ranks after 6 steps \(4 tensors\) bit-identical: "
          r"True"] if HAS_MPI else [r"skipped the 2-rank run: (mpi4py|mpiexec) is not installed"])),
    "12_a_real_training_run.py": (["--quick", "--out"], [
        r"model: ResNet-18, small-input stem, 11172810 parameters; 64 training images, batch 16 "
        r"in 2 micro-batches of 8, 2 epochs = 8 updates",
        r"child process \d+ killed with SIGKILL after its checkpoint 2 \(exit code -9\)",
        r"the checkpoint it left holds step 4 of 8",
        r"resumed from step 4: losses and learning rates bit-identical to the uninterrupted run: "
        r"True; all 122 parameters and buffers bit-identical: True; loss scale equal: True",
    ]),
    "13_attention_under_amp.py": (["--quick", "--out"], [
        r"%\d+: f16\[2,4,4\] = softmax\(%\d+\)",
        r"softmax dtype under AMP \(OneFlow's rule\): f16",
        r"amp \(softmax in float16\): output error > 1e-2 from score std 16\b",
        r"amp: non-finite output from score std 65536 ",
        r"softmax dtype without the identity: f16",
        r"softmax dtype with amp_black_identity on the scores: f32",
        r"amp\+black_scores output error equal to amp's at every scale: True",
        r"enable_amp\(black_add=\['batch_matmul'\]\) \(the study's amp\+black_matmul\): "
        r"largest error \d\.\d\de-0[5-7], equal to fp32's at every scale: True",
        r"AMP, scale after the product \(the default\) +softmax f16: inf/NaN",
        r"AMP, q \* 1/sqrt\(d\) before the product +softmax f16: max \|out - float64\| "
        r"\d\.\d\de-0[2-4]",
        r"enable_amp\(black_add=\['batch_matmul'\]\) +softmax f32: max \|out - float64\| "
        r"(0\.00e\+00|\d\.\d\de-(0[5-9]|[1-9]\d))",
    ]),
}


def test_every_tutorial_is_tested_and_listed_in_the_readme():
    scripts = sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*.py"))
    assert scripts == sorted(CASES)
    readme = (TUTORIALS / "README.md").read_text()
    assert all(f"python tutorials/{s}" in readme for s in scripts)


def _lesson_env() -> dict:
    """The environment a lesson runs in: this checkout first on PYTHONPATH, matplotlib without
    a display, the default backend."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["MPLBACKEND"] = "Agg"
    env.pop("MINIFLOW_BACKEND", None)
    # The lessons' matmuls are tiny: BLAS threads only add contention on a small, busy runner.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


@pytest.mark.parametrize("script", sorted(s for s, (flags, _) in CASES.items() if "--out" in flags))
def test_a_lesson_given_a_file_as_out_folder_says_so_without_a_traceback(script, tmp_path):
    """``--out`` at a file: every lesson with an output folder ended in mkdir's FileExistsError
    (a traceback); now a usage error (exit code 2) naming ``--out`` and the file, before any
    work (``miniflow.notebook.out_folder``)."""
    file = tmp_path / "results"
    file.write_text("not a folder")
    r = subprocess.run([sys.executable, str(TUTORIALS / script), "--out", str(file)],
                       cwd=tmp_path, env=_lesson_env(), capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert f"--out {file}: it is a file; give a folder (made if missing)" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and file.read_text() == "not a folder"


@pytest.mark.parametrize("script", sorted(CASES))
def test_a_lesson_answers_help_and_refuses_an_unknown_option(script, tmp_path):
    """``--help`` prints the lesson's usage and runs nothing; an option it does not take is a
    usage error (exit code 2). Before, lessons 1 and 9 parsed no arguments: ``--help`` ran the
    whole lesson, and ``--quick`` or a misspelt ``--out`` was ignored."""
    def run(flag):
        return subprocess.run([sys.executable, str(TUTORIALS / script), flag], cwd=tmp_path,
                              env=_lesson_env(), capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    r = run("--help")
    assert r.returncode == 0 and r.stdout.startswith(f"usage: {script} [-h]"), r.stdout[:500]
    assert "==" not in r.stdout                  # no section of the lesson ran
    r = run("--no-such-option")
    assert r.returncode == 2 and "error: unrecognized arguments: --no-such-option" in r.stderr


@pytest.mark.parametrize("epochs", ["0", "-2"])
def test_lesson_7_refuses_epochs_below_one(epochs, tmp_path):
    """``--epochs 0`` trained the default 20 epochs (``args.epochs or 20``), ``--epochs -2``
    ended in ``amp_report()``'s traceback after an empty run; both are a usage error now."""
    r = subprocess.run([sys.executable, str(TUTORIALS / "07_train_digits.py"), "--epochs",
                        epochs, "--out", str(tmp_path)], cwd=tmp_path, env=_lesson_env(),
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout[-500:])
    assert f"error: --epochs must be an integer >= 1, got {epochs}" in r.stderr


@pytest.mark.parametrize("script", sorted(CASES))
def test_tutorial_runs_and_prints_its_key_fact(script, tmp_path):
    flags, checks = CASES[script]
    args = []
    for flag in flags:
        args += ["--out", str(tmp_path)] if flag == "--out" else [flag]
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(TUTORIALS / script), *args], cwd=tmp_path,
                       env=_lesson_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
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
