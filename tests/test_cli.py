"""The command line: argument validation and ``info``."""
import os
import subprocess
import sys

import pytest

from miniflow.cli import main


@pytest.mark.parametrize("args,match", [
    (["--epochs", "0"], "--epochs: must be an integer >= 1"),
    (["--batch-size", "x"], "--batch-size: must be an integer >= 1"),
    (["--lr", "-1"], "--lr: must be a finite number > 0"),
    (["--momentum", "inf"], "--momentum: must be a finite number >= 0"),
])
def test_train_rejects_bad_arguments_with_a_usage_error(args, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *args])
    assert e.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["ir", "--model", "gpt", "--onnx", ""],
                                  ["attention-study", "--out", ""],
                                  ["stability", "--quick", "--out", ""],
                                  ["stability", "--quick", "--logdir", ""],
                                  ["train", "--logdir", ""]], ids=" ".join)
def test_an_empty_path_is_a_usage_error_naming_the_option(argv, capsys, monkeypatch, tmp_path):
    """``--out ""`` (an unset shell variable) wrote attention-study's results into the working
    folder, ``ir --onnx ""`` was refused after lowering as "'' is a folder"; every path option
    of every subcommand is now refused before anything runs or is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    option = argv[-2]
    assert e.value.code == 2
    assert f"error: {option} needs a path, got an empty one" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_info_prints_backend_and_versions(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend: cpu" in out and "numba " in out and "float16 conversion on the CPU" in out
    assert "data parallel: mpi4py " in out or \
        "data parallel: not installed (pip install 'miniflow[dist]')" in out
    from miniflow.kernels.cpu import blas_split
    assert f"threads: {blas_split.describe()}\n" in out


@pytest.mark.parametrize("value", ["-1", "1.5", "abc"])
def test_train_rejects_a_bad_seed_naming_what_is_accepted(value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--seed", value])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert f"argument --seed: must be an integer >= 0, got {value!r}" in err


def test_stability_backend_option_selects_the_backend(monkeypatch, tmp_path, capsys):
    """``--backend cpu`` reaches ``set_backend`` before the study starts; another name is a usage
    error listing the choices."""
    import miniflow as mf
    from miniflow.experiments import stability

    class Started(Exception):
        pass

    def run_study(cfg, out, logdir=None):
        raise Started(mf.get_backend().name)

    monkeypatch.setattr(stability, "run_study", run_study)
    with pytest.raises(Started, match="^cpu$"):
        main(["stability", "--quick", "--backend", "cpu", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as e:
        main(["stability", "--backend", "gpu"])
    assert e.value.code == 2 and "invalid choice: 'gpu'" in capsys.readouterr().err


def test_train_ddp_in_a_one_rank_world_and_save(tmp_path, capsys):
    """``miniflow train --ddp`` without a launcher: a world of one rank, the sampler's order;
    ``--save`` writes the model's state_dict."""
    import miniflow as mf
    path = tmp_path / "model.safetensors"
    assert main(["train", "--ddp", "--epochs", "1", "--save", str(path)]) == 0
    out = capsys.readouterr().out
    assert "data parallel: world size 1, batch 64 per rank (64 per step)" in out
    assert "23 steps" in out and f"saved the model's state_dict to {path}" in out
    assert sorted(mf.load(str(path))) == ["0.bias", "0.weight", "2.bias", "2.weight"]


def test_train_ddp_gives_the_callers_thread_counts_back(capsys):
    """``--ddp`` gives Numba's and the BLAS's pools the rank's share of the cores for the run
    (``cli._pinned_threads``: here all of them, one rank) and the caller's counts back after it:
    ``main()`` runs in-process in tests and notebooks (before: both stayed pinned for the rest
    of the process, and a later test in that pytest worker ran no parallel kernel)."""
    import os

    import numba

    from miniflow.kernels.cpu.common import numpy_blas, pinned_threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if min(cores, numba.config.NUMBA_NUM_THREADS) < 2:
        pytest.skip("one core: the run pins the threads the caller has")
    with pinned_threads(1):
        assert main(["train", "--ddp", "--epochs", "1", "--hidden", "8",
                     "--no-progress"]) == 0
        assert numba.get_num_threads() == 1
        assert [lib.num_threads for lib in numpy_blas()] == [1] * len(numpy_blas())
    assert f"{cores} thread(s) per rank" in capsys.readouterr().out


@pytest.mark.parametrize("affinity,ranks,threads", [([3], 1, 1), ([0, 1, 2, 3], 2, 2),
                                                     ([5], 2, 1)])
def test_ddp_threads_share_the_cores_the_process_may_run_on(monkeypatch, affinity, ranks,
                                                            threads):
    """``--ddp``'s threads per rank are the cores of the process's CPU affinity (``taskset``, a
    batch system's CPU set) over the ranks on the machine (before: every core of the machine,
    ``os.cpu_count()``, so ranks restricted to fewer cores shared them, and the run line named
    more threads than the ranks could use)."""
    import os

    from miniflow import cli
    from miniflow.kernels.cpu import team
    monkeypatch.setattr(team, "cores", lambda: affinity)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    with cli._pinned_threads(ranks) as n:
        assert n == threads


def test_cli_jobs_run_on_the_cpu_unless_asked_and_say_why(monkeypatch):
    """``choose_backend``: cpu by default even with a GPU (a cuda step of these small MLPs is
    not faster), with the reason on one line; ``--backend`` and ``MINIFLOW_BACKEND`` win."""
    import miniflow as mf
    import miniflow.runtime.backend as backend
    from miniflow.cli import choose_backend
    monkeypatch.delenv("MINIFLOW_BACKEND", raising=False)
    monkeypatch.setattr(backend, "cuda_status", lambda: (False, "no driver"))
    assert choose_backend("train", None) == "backend: cpu (no GPU)"
    monkeypatch.setattr(backend, "cuda_status", lambda: (True, "H100 (compute capability 9.0)"))
    line = choose_backend("stability", None)
    assert line.startswith("backend: cpu (the default for this job, although a GPU is usable "
                           "(H100 (compute capability 9.0)): ") and "--backend cuda" in line
    assert "\n" not in line and mf.get_backend().name == "cpu"
    assert choose_backend("train", "cpu") == "backend: cpu (--backend cpu)"
    monkeypatch.setenv("MINIFLOW_BACKEND", " CPU ")
    assert choose_backend("train", None) == "backend: cpu (MINIFLOW_BACKEND=CPU)"


def test_train_prints_its_backend_first(monkeypatch, capsys):
    from miniflow.experiments import train

    class Started(Exception):
        pass

    def train_digits(*args, **kwargs):
        raise Started

    monkeypatch.delenv("MINIFLOW_BACKEND", raising=False)
    monkeypatch.setattr(train, "train_digits", train_digits)
    with pytest.raises(Started):
        main(["train", "--epochs", "1", "--backend", "cpu"])
    assert capsys.readouterr().out.splitlines() == ["backend: cpu (--backend cpu)"]


def test_train_without_ddp_runs_in_a_fresh_process():
    """No process world is set up without ``--ddp`` (rank 0 is the only process)."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    r = subprocess.run([sys.executable, "-m", "miniflow", "train", "--epochs", "1", "--hidden",
                        "8", "--backend", "cpu"], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[0] == "backend: cpu (--backend cpu)"


def test_save_is_checked_before_the_first_step(monkeypatch, tmp_path, capsys):
    """Issue 22 item 7: a ``--save`` path that cannot be written (a missing folder, a FIFO
    standing for a device such as ``/dev/full``) is refused before training starts, exit code
    2 and no traceback, as ``--checkpoint`` and ``stability --out`` are (before: only after the
    whole run, in a traceback; as root a device node was replaced by a regular file)."""
    import os
    import stat

    from miniflow.experiments import train

    def train_digits(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(train, "train_digits", train_digits)
    code = main(["train", "--save", str(tmp_path / "nope" / "m.safetensors")])
    err = capsys.readouterr().err
    assert code == 2 and "miniflow train: --save " in err and "does not exist" in err, err
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        code = main(["train", "--save", str(tmp_path / "fifo")])
        err = capsys.readouterr().err
        assert code == 2 and "is a FIFO, not a regular file" in err, err
        assert stat.S_ISFIFO(os.stat(tmp_path / "fifo").st_mode)


@pytest.mark.parametrize("args, match", [
    (["--model", "lenet", "--hidden", "64"],
     "--hidden sets the MLP's hidden units; --model lenet has a fixed architecture"),
    (["--model", "resnet18", "--hidden", "8"], "--model resnet18 has a fixed architecture"),
    (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint DIR"),
])
def test_an_option_that_would_be_ignored_is_a_usage_error(args, match, capsys):
    """Issue 22 item 21: argparse's rule for options that conflict (``error()``, exit code 2)
    instead of ignoring them silently (before: the run went on without them)."""
    with pytest.raises(SystemExit) as e:
        main(["train", *args])
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_the_model_line_names_every_setting_and_says_1_epoch(capsys):
    """Issue 22 item 21: accumulation and clipping on the model line, "1 epoch" singular."""
    assert main(["train", "--epochs", "1", "--hidden", "8", "--accumulate", "2", "--clip-norm",
                 "0.5", "--no-progress"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("model:"))
    assert line == ("model: mlp, 1 epoch of SGD (lr 0.1, constant schedule, momentum 0.9, "
                    "weight decay 0, batch 64 as 2 accumulated micro-batches of 32, gradients "
                    "clipped to an L2 norm of 0.5), float32")


def test_a_batch_size_above_the_training_set_prints_the_batch_it_used(capsys):
    """``--batch-size 5000`` over the 1437 training rows trains on all of them per step (as
    PyTorch's DataLoader does); the model line said ``batch 5000`` (``mpiexec -n 2 miniflow
    train --ddp``, a rank's shard: tests/test_data_parallel.py)."""
    assert main(["train", "--batch-size", "5000", "--epochs", "1", "--hidden", "8",
                 "--accumulate", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert ("weight decay 0, batch 1436 as 2 accumulated micro-batches of 718 (--batch-size 5000 "
            "is more than the 1437 rows of the training set)), float32") in out, out
    assert "for 1 steps" in out, out


def test_accumulate_above_the_training_set_is_a_message_not_a_traceback(capsys):
    """``--batch-size 2000 --accumulate 2000`` leaves no batch of the 1437 training rows:
    ``train_digits``' DataSizeError is one line on stderr and exit code 2 (it was a traceback)."""
    assert main(["train", "--batch-size", "2000", "--accumulate", "2000", "--epochs", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("miniflow train: train_digits: accumulate 2000 needs at least 2000 "
                          "rows per batch, but the training set has 1437"), err
    assert "Traceback" not in err


def test_train_help_gives_gpts_defaults_too(capsys):
    """``miniflow train --help`` names every ``--model`` choice's defaults (``--model gpt``'s
    come from ``GPT_DEFAULTS``; they were left out, so its 6 epochs, lr 0.003 and batch 32
    were nowhere); argparse's documented ``help`` is what the user reads."""
    from miniflow.experiments.train_gpt import GPT_DEFAULTS
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for key in ("epochs", "lr", "weight_decay", "lr_schedule"):
        assert f"gpt {GPT_DEFAULTS[key]:g}" in text if isinstance(GPT_DEFAULTS[key], float) \
            else f"gpt {GPT_DEFAULTS[key]}" in text, key
    assert f"default 64 (gpt: {GPT_DEFAULTS['batch_size']})" in text


def test_help_gives_the_default_of_every_option(capsys):
    """Issue 22 item 21: every option with a value says its default in ``--help`` (as
    ``argparse.ArgumentDefaultsHelpFormatter`` would; before: ``--hidden`` and ``stability
    --out`` did not); flags are off by default."""
    import argparse

    from miniflow.cli import parser
    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("train", "stability"):
        for action in commands.choices[command]._actions:
            if action.nargs == 0:             # --help and store_true flags
                continue
            assert "default" in action.help, (command, action.option_strings, action.help)
    with pytest.raises(SystemExit):
        main(["stability", "--help"])
    assert "(default stability-results)" in capsys.readouterr().out


@pytest.mark.parametrize("name, value, accepted", [
    ("MINIFLOW_MATMUL", "garbage", "one of auto, numba, blas, packed, mkl"),
    ("MINIFLOW_BACKEND", "bogus", "one of cpu, cuda (any case)"),
    ("MINIFLOW_CUBLAS", "yes", "0 or 1"),
    ("MINIFLOW_DIST_TIMEOUT", "-5", "a positive number of seconds")])
@pytest.mark.parametrize("argv", [["train", "--epochs", "1"], ["info"], ["ir"],
                                  ["train", "--ddp", "--epochs", "1"]])
def test_a_bad_environment_value_is_one_line_and_exit_code_2_in_every_subcommand(
        name, value, accepted, argv, monkeypatch, capsys):
    """A new user's finding: ``MINIFLOW_MATMUL=garbage miniflow train`` printed a 55-line
    traceback; then ``MINIFLOW_BACKEND=bogus miniflow info`` exited 1 where ``train`` exited 2,
    and ``info`` under a bad ``MINIFLOW_MATMUL`` exited 0. Every subcommand now prints the one
    line of ``miniflow.environment`` (the variable, the value, the accepted values) and exits
    2, before anything runs."""
    monkeypatch.setenv(name, value)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"miniflow: {name}={value!r} is not {accepted}: ")
    assert captured.err.count("\n") == 1 and captured.out == ""


def test_train_under_a_launcher_without_ddp_is_a_usage_error(monkeypatch, capsys):
    """``mpiexec -n 2 miniflow train`` without ``--ddp`` ran two separate copies of the run."""
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        main(["train", "--epochs", "1"])
    assert e.value.code == 2
    assert ("started by a launcher with 2 ranks (mpiexec -n 2) but without --ddp: every rank "
            "would train a copy of the same run on its own") in capsys.readouterr().err
    monkeypatch.setenv("PMI_SIZE", "1")         # a one-rank launch is one run
    monkeypatch.setenv("MINIFLOW_MATMUL", "garbage")     # stops right after the argument checks
    assert main(["train", "--epochs", "1"]) == 2


def test_ir_takes_the_gpt_of_train(capsys):
    """``miniflow ir --model gpt`` was a usage error while ``train --model gpt`` exists; it prints
    the GPT training step of ``train --model gpt``'s defaults (batch 32 of 64 ids), attention
    and all, and under ``--amp`` its float16 casts."""
    assert main(["ir", "--model", "gpt"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# gpt training step, float32, batch 32: the IR after ")
    for op in ("layer_norm", "batch_matmul", "softmax"):
        assert f"= {op}(" in out, op
    assert "f32[32,64,96]" in out and "f16" not in out
    assert main(["ir", "--model", "gpt", "--amp"]) == 0
    out = capsys.readouterr().out
    assert "AMP (float16) with a dynamic loss scale" in out
    assert "{dtype=f16}" in out and "f16[32,4,64,64] = softmax(" in out


@pytest.mark.parametrize("after, why", [
    ("bogus", ""),
    ("data_parallel", " (data_parallel runs only in the data-parallel step of train --ddp")])
def test_ir_names_a_bad_after_as_the_option(after, why, capsys):
    """``ir --after bogus`` said "TrainGPT.lower: after='bogus' ...", and ``data_parallel``
    told to call ``config.enable_data_parallel(True)``, which ir has no option for: both now
    name ``--after`` and its value, with this graph's stages."""
    assert main(["ir", "--model", "gpt", "--after", after]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"miniflow ir: --after {after} is no stage of this graph{why}"), err
    assert "choose one of trace, autograd," in err and "lower" not in err
    assert "enable_data_parallel" not in err


def test_ir_with_a_batch_too_large_for_the_memory_is_one_line(monkeypatch, capsys):
    """``ir --batch-size 100000000`` ended in NumPy's ``_ArrayMemoryError`` traceback (24 GiB of
    zeros for the example batch); it is one line naming the option, exit code 1, as train's."""
    from miniflow.experiments import show_ir

    def model_graph(*args, **kwargs):     # NumPy's error, without allocating 24 GiB here
        raise MemoryError("Unable to allocate 23.8 GiB for an array with shape (100000000, 64)")

    monkeypatch.setattr(show_ir, "model_graph", model_graph)
    assert main(["ir", "--batch-size", "100000000"]) == 1
    assert capsys.readouterr().err == (
        "miniflow ir: out of memory (Unable to allocate 23.8 GiB for an array with shape "
        "(100000000, 64)): give a smaller --batch-size\n")


@pytest.mark.parametrize("after", ["optimizer", "autograd", "loss_scale"])
def test_ir_eval_after_a_training_pass_is_a_usage_error(after, capsys):
    """``ir --eval --after optimizer`` printed the evaluation graph unchanged, under a header
    saying "the IR after optimizer" (the training passes run as no-ops on it); it is a usage
    error naming the passes that change an evaluation graph."""
    with pytest.raises(SystemExit) as e:
        main(["ir", "--eval", "--after", after])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: miniflow ir "), err
    assert (f"miniflow ir: error: --after {after}: the evaluation graph (--eval) has no "
            "gradients or updates, so " in err)
    assert ("give trace or one of auto_mixed_precision (amp), prune_amp_identity, "
            "fuse_elementwise, dead_code_elimination, or drop --eval" in err)


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_the_training_passes_leave_an_evaluation_graph_unchanged(model):
    """What the usage error above relies on: on an evaluation graph (AMP on, every pass runs)
    each pass of ``TRAINING_PASSES`` returns the IR it was given."""
    from miniflow.experiments.show_ir import model_graph
    from miniflow.passes.pipeline import TRAINING_PASSES
    graph, inputs = model_graph(model, amp=True, eval=True, batch_size=2)
    stages = graph.stages(*inputs)
    texts = [str(graph.lower(*inputs, after=s)) for s in stages]
    training = [s for s in stages if s in TRAINING_PASSES]
    assert len(training) == len(TRAINING_PASSES) - 1          # all but data_parallel
    for k, stage in enumerate(stages):
        if stage in TRAINING_PASSES:
            assert texts[k] == texts[k - 1], stage
    assert texts[-1] != texts[0]


def test_ctrl_c_in_stability_is_one_line_and_exit_code_130(monkeypatch, tmp_path, capsys):
    """Ctrl-C during ``miniflow stability`` (minutes of runs) printed the run's traceback and
    the process died of SIGINT; it is now one line saying where the results would have gone
    and exit code 130, as ``train``'s Ctrl-C."""
    from miniflow.experiments import stability

    def run_study(cfg, out, logdir=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(stability, "run_study", run_study)
    out, logdir = tmp_path / "out", tmp_path / "runs"
    assert main(["stability", "--quick", "--out", str(out), "--logdir", str(logdir)]) == 130
    err = capsys.readouterr().err
    assert err.startswith("miniflow stability: interrupted before the study finished: ")
    assert f"written to {out}/ only when every run has finished" in err
    assert f"runs done so far are in {logdir}/" in err and err.count("\n") == 1


def test_ctrl_c_while_stability_writes_its_results_names_the_files_written(monkeypatch,
                                                                           tmp_path, capsys):
    """Ctrl-C after the runs, while the results were being written, said they are written
    "only when every run has finished" (they had, and metrics.json was new); the line names the
    files this study wrote and those it did not (a file of an earlier study is not counted)."""
    import os
    from miniflow.experiments import stability

    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.md").write_text("an earlier study's")
    os.utime(out / "summary.md", (0, 0))

    def run_study(cfg, out, logdir=None):
        (out / "metrics.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(stability, "run_study", run_study)
    assert main(["stability", "--quick", "--out", str(out)]) == 130
    rest = ", ".join(stability.OUTPUT_FILES[1:])
    assert capsys.readouterr().err == (
        f"miniflow stability: interrupted while writing the results of the finished runs to "
        f"{out}/: metrics.json written, {rest} not; run it again to start over\n")


def test_ctrl_c_in_any_subcommand_is_one_line_and_exit_code_130(monkeypatch, tmp_path, capsys):
    """A subcommand without its own Ctrl-C message (attention-study, ir) ends with one line and
    exit code 130, not a traceback."""
    from miniflow.experiments import attention_study

    def study():
        raise KeyboardInterrupt

    monkeypatch.setattr(attention_study, "study", study)
    assert main(["attention-study", "--out", str(tmp_path)]) == 130
    assert capsys.readouterr().err == (
        f"miniflow attention-study: interrupted before the study finished: nothing is written "
        f"(results.json and its figure come at the end) in {tmp_path}/; run it again\n")
    from miniflow.experiments import show_ir
    monkeypatch.setattr(show_ir, "show_ir", lambda *a, **k: study())
    assert main(["ir"]) == 130
    assert capsys.readouterr().err == "miniflow ir: interrupted\n"


SIGTERM_CHILD = """
import os, signal, sys, time
from miniflow import cli
import miniflow.experiments.{module} as target

def terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)

target.{function} = terminated
raise SystemExit(cli.main(sys.argv[1:]))
"""


@pytest.mark.skipif(os.name != "posix", reason="SIGTERM")
@pytest.mark.parametrize("module, function, argv, line", [
    ("stability", "run_study", ["stability", "--quick", "--out", "{tmp}"],
     "interrupted before the study finished: its metrics.json, summary.md and figures are "
     "written to {tmp}/ only when every run has finished; run it again to start over"),
    ("attention_study", "study", ["attention-study", "--out", "{tmp}"],
     "interrupted before the study finished: nothing is written (results.json and its figure "
     "come at the end) in {tmp}/; run it again"),
    ("show_ir", "show_ir", ["ir"], "interrupted")])
def test_sigterm_in_any_subcommand_is_one_line_and_exit_code_143(module, function, argv, line,
                                                                  tmp_path):
    """SIGTERM (``timeout -s TERM``, ``kill``, a batch system's first signal) killed
    ``miniflow stability``, ``attention-study`` and ``ir`` with no line (exit status -15, as
    Python's default); each ends as after Ctrl-C, its line after 'SIGTERM: ', exit code 143
    (128 + SIGTERM), as ``train``'s."""
    code = SIGTERM_CHILD.format(module=module, function=function)
    argv = [a.format(tmp=tmp_path) for a in argv]
    child = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                           timeout=120)
    lines = [ln for ln in child.stderr.splitlines() if ln.startswith("miniflow ")
             and not ln.startswith("miniflow: compiling kernels")]
    assert child.returncode == 143 and "Traceback" not in child.stderr, child.stderr
    assert lines == [f"miniflow {argv[0]}: SIGTERM: {line.format(tmp=tmp_path)}"], child.stderr



CLOSED_STDOUT_CHILD = """
import os, runpy, sys
read, write = os.pipe()
os.dup2(write, 1)                   # stdout: a pipe whose reader is gone (| head -1 after it ended)
os.close(read)
os.close(write)
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


@pytest.mark.skipif(os.name != "posix", reason="a pipe without a reader")
@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("argv", [["miniflow", "info"], ["miniflow.exercises", "list"],
                                  ["miniflow", "ir", "--model", "mlp"]])
def test_a_closed_stdout_ends_quietly_with_exit_code_141(buffered, argv):
    """``miniflow info | head -1`` (``python -m miniflow.exercises list`` too) ended in a
    ``BrokenPipeError`` traceback (or, with stdout buffered, 'Exception ignored ...
    BrokenPipeError' and exit code 120); it ends as a command that SIGPIPE stops: nothing on
    stderr, exit code 141 (128 + SIGPIPE). ``miniflow ir | head -1`` took the broken pipe for a
    bad ``--onnx`` path (an ``OSError``): 'miniflow ir: [Errno 32] Broken pipe', exit code 2."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    child = subprocess.run([sys.executable, "-c", CLOSED_STDOUT_CHILD, *argv],
                           capture_output=True, text=True, env=env, timeout=120)
    assert child.returncode == 141 and child.stderr == "", child.stderr


def test_version_prints_the_version_as_info_does(capsys):
    """``miniflow --version`` was a usage error ("the following arguments are required:
    command"); it prints ``info``'s first line and exits 0."""
    import miniflow
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"miniflow {miniflow.__version__}\n"


@pytest.mark.parametrize("model,sizes", [("mlp", "--batch-size or --hidden"),
                                         ("lenet", "--batch-size")])
def test_out_of_memory_names_the_sizes_that_set_it(monkeypatch, capsys, model, sizes):
    """``--hidden 100000000`` ran out of memory with the advice "give a smaller --batch-size",
    which would not help; the MLP's advice names --hidden too."""
    from miniflow.experiments import train

    def train_digits(*args, **kwargs):
        raise MemoryError("Unable to allocate 47.7 GiB for an array")

    monkeypatch.setattr(train, "train_digits", train_digits)
    assert main(["train", "--model", model, "--epochs", "1"]) == 1
    assert capsys.readouterr().err == ("miniflow train: out of memory (Unable to allocate 47.7 "
                                       f"GiB for an array): give a smaller {sizes}\n")


def test_a_run_that_diverged_says_so_and_exits_1(capsys, tmp_path):
    """A digits run whose weights became NaN or inf printed its results (accuracy 10%) and
    exited 0, where a diverged GPT run exits 1; it now ends with one line saying so, exit
    code 1 (the results and --save are still written)."""
    save = tmp_path / "m.safetensors"
    code = main(["train", "--epochs", "1", "--lr", "1e30", "--hidden", "8", "--no-progress",
                 "--save", str(save)])
    out, err = capsys.readouterr()
    assert code == 1 and "test accuracy: " in out and save.exists()
    assert err.endswith("miniflow train: the run diverged: 4 of the model's tensors hold NaN or "
                        "inf (0.weight, 0.bias, 2.weight ...); train with a smaller --lr, or "
                        "clip with --clip-norm\n"), err


def test_stability_names_every_level_of_its_tensorboard_runs(monkeypatch, tmp_path, capsys):
    """The last line said "one run per experiment, policy and seed", but the runs are per scale
    too (``<logdir>/<experiment>/<policy>/<scale>/seed<n>``, as ``--help`` and tools.md say)."""
    pytest.importorskip("tensorboardX")
    from miniflow.experiments import stability, stability_report
    monkeypatch.setattr(stability, "run_study",
                        lambda cfg, out, logdir=None: {"runs": [], "config": {"seconds": 1.0}})
    monkeypatch.setattr(stability_report, "headline_table", lambda metrics: "")
    logdir = tmp_path / "runs"
    assert main(["stability", "--quick", "--out", str(tmp_path / "out"), "--logdir",
                 str(logdir)]) == 0
    assert f"TensorBoard: one run per experiment, policy, scale and seed in {logdir}/" in \
        capsys.readouterr().out
