"""``miniflow`` / ``python -m miniflow``: subcommands ``info``, ``train`` (``--model mlp|lenet|
resnet18|gpt``, ``--amp [fp16|bf16]``; gpt's options and run: ``miniflow.cli_gpt``),
``stability``, ``attention-study`` (``miniflow.cli_gpt``) and ``ir`` (a model's IR after a pass,
``--model`` as train's, ``--onnx``)."""
from __future__ import annotations

import argparse
import contextlib
import math
import platform
import sys


def _info(args) -> int:
    """Versions (MPI's for data parallel too), the backend, the GPU (or why there is none), the
    float16 path, the kernel cache, the CPU (ISA, BLAS core type) and the measured kernel choices.

    Never a traceback: a backend that cannot be used (``MINIFLOW_BACKEND=cuda`` without a GPU)
    is reported on the ``backend:`` line and the exit code is 1 (a bad ``MINIFLOW_*`` value is
    :func:`main`'s one line and exit code 2).
    """
    import importlib.metadata

    import numba
    import numpy

    import miniflow
    from .kernels.common.cache import CACHE
    from .kernels.cpu import fp16
    from .runtime.backend import BackendUnavailableError, cuda_status

    try:
        numba_cuda = importlib.metadata.version("numba-cuda")
    except importlib.metadata.PackageNotFoundError:
        numba_cuda = "not installed (pip install 'miniflow[cuda]')"
    print(f"miniflow {miniflow.__version__}")
    print(f"python {platform.python_version()} on {platform.machine()}")
    print(f"numpy {numpy.__version__}, numba {numba.__version__}, numba-cuda {numba_cuda}")
    try:
        mpi = (f"mpi4py {importlib.metadata.version('mpi4py')}, "
               f"mpich {importlib.metadata.version('mpich')} (mpiexec -n N ...)")
    except importlib.metadata.PackageNotFoundError:
        mpi = "not installed (pip install 'miniflow[dist]')"
    print(f"data parallel: {mpi}")
    usable, gpu = cuda_status()
    print(f"GPU: {gpu}" if usable else f"GPU: no GPU ({gpu})")
    try:
        backend = miniflow.get_backend()
        print(f"backend: {backend.name}")
    except BackendUnavailableError as e:
        backend = None
        print(f"backend: unavailable: {e}")
    print(f"float16 conversion on the CPU: {fp16.PATH}")
    print(f"Numba cache of the kernels: {CACHE.describe()}")
    if CACHE.enabled and not fp16.JIT_CACHE:
        print("  (off for the CPU kernels: MINIFLOW_FP16_FALLBACK=1)")
    if backend is None:
        print("kernels from the Numba cache: not checked (no usable backend)")
        return 1
    print(f"kernels from the Numba cache: {_cache_probe(backend)}")
    _print_tuning()
    return 0


def _print_tuning() -> None:
    """The CPU Numba compiles for, the BLAS libraries and the kernel choices measured on this
    machine (``kernels.cpu.tune``)."""
    from .kernels.cpu import blas_split, mkl_gemm, target, tune

    m = tune.machine()
    print(f"CPU: {m['cpu']}; Numba compiles for {target.describe()}")
    print(f"BLAS (core type): {'; '.join(m['blas']) or 'none loaded'}")
    print(f"threads: {blas_split.describe()}")
    print(mkl_gemm.describe())
    for line in tune.describe():
        print(line)


def _cache_probe(backend) -> str:
    """Run one small kernel (relu, f32) on ``backend`` and say whether it was loaded from Numba's
    on-disk cache or compiled now (or why it could not run: ``info`` never raises)."""
    import numpy as np

    from .dtype import float32
    from .ir import Node, Value
    from .ops import get_op
    from .runtime.plan import build_steps

    node = Node(get_op("relu"), [Value("x", (4,), float32, kind="input")], [])
    node.outputs = [Value("y", (4,), float32, producer=node)]
    try:
        buffers = {node.inputs[0]: backend.from_numpy(np.zeros(4, np.float32))}
        steps, _ = build_steps([node], buffers, backend)
        for fn, a in steps:
            fn(*a)
    except Exception as e:  # noqa: BLE001 (a diagnostic: report the failure, do not crash)
        return f"unknown: the probe kernel failed ({type(e).__name__}: {e})"
    kernel = getattr(steps[0][0], "kernel", steps[0][0])
    stats = getattr(kernel, "stats", None)
    if stats is None:
        return "no (the CUDA simulator runs kernels as Python)"
    if sum(stats.cache_hits.values()):
        return "yes (loaded, not compiled)"
    if not getattr(stats, "cache_path", None):
        return "no (caching is off for these kernels)"
    return "no (compiled now and cached for the next run)"


JOB_BACKEND_RULE = {
    "train": "a cpu step of its default 64-128-10 MLP takes ~0.06 ms, a cuda step makes 14 "
             "kernel launches for a few microseconds of GPU work each",
    "stability": "a cpu step of its 64-128-10 MLPs takes under 0.1 ms, a cuda step makes "
                 "dozens of kernel launches and the study reads its metrics back after every "
                 "step",
}
"""Why the CLI jobs run on the cpu backend by default, even with a GPU (benchmarks/README.md,
"cuda host overhead"): until a cuda step is measured faster than the cpu step for the job's
workload on a real GPU, the cpu is the faster choice for these small models."""


def choose_backend(job: str, requested: str | None) -> str:
    """Select the backend of CLI job ``job`` (``"train"``, ``"stability"``) and return one line
    saying which and why. ``requested`` (``--backend``) wins, then ``MINIFLOW_BACKEND``; else
    ``cpu``, for the reason in :data:`JOB_BACKEND_RULE` (the library's own default,
    ``runtime.backend.default_backend_name``, is cuda whenever a GPU is usable).

    Raises:
        BackendUnavailableError: cuda without a GPU (for ``--backend cuda`` naming the flag, not
            the variable).
    """
    import os

    import miniflow
    from .runtime.backend import BackendUnavailableError, cuda_status, default_backend_name
    env = os.environ.get("MINIFLOW_BACKEND", "").strip()
    if requested:
        name, why = requested, f"--backend {requested}"
    elif env:
        name, why = default_backend_name(), f"MINIFLOW_BACKEND={env}"
    else:
        usable, gpu = cuda_status()
        name = "cpu"
        why = (f"the default for this job, although a GPU is usable ({gpu}): "
               f"{JOB_BACKEND_RULE[job]}; --backend cuda to use the GPU"
               if usable and gpu != "CUDA simulator" else "no GPU")
    try:
        miniflow.set_backend(name)
    except BackendUnavailableError:
        if not requested:           # MINIFLOW_BACKEND=cuda: the message names the variable
            raise
        raise BackendUnavailableError(
            f"miniflow {job}: --backend {name}, but no CUDA device was found "
            f"({cuda_status()[1]}); give --backend cpu, or leave --backend out (cpu without a "
            "GPU). To use an NVIDIA GPU, install its driver and the cuda extra: pip install "
            "'miniflow[cuda]'.") from None
    return f"backend: {name} ({why})"


def _train(args) -> int:
    """Train ``--model`` on the digits (``miniflow.experiments.train``); with ``--ddp`` on every
    rank of the MPI world, rank 0 alone printing and writing files. A checkpoint that cannot be
    used, or a ``--save`` path that cannot be written (checked before the first step), is a
    message and exit code 2, not a traceback; Ctrl-C is one line naming the step and the last
    checkpoint, and exit code 130 (128 + SIGINT, the shell's convention), SIGTERM the same line
    after 'SIGTERM: ' and exit code 143 (128 + SIGTERM). A world that cannot
    be set up (a bad ``MINIFLOW_DIST_TIMEOUT``, a launcher without mpi4py or of another MPI) is
    a message and exit code 2 too."""
    from . import distributed
    if not args.ddp:
        return _train_run(args, None)
    try:
        distributed.init()
    except (ValueError, RuntimeError) as e:
        print(f"miniflow train --ddp: {e}", file=sys.stderr)
        return 2
    with _pinned_threads(distributed.local_world_size()) as threads:
        return _train_run(args, threads)


def _train_run(args, threads: int | None) -> int:
    """:func:`_train` after the world is set up: ``threads`` per rank under ``--ddp`` (pinned by
    :func:`_pinned_threads`), else None. A run that diverged (:func:`_diverged`) prints its
    results, then one line, and exits with code 1."""
    from . import distributed
    from .amp import NonFiniteGradientsError
    from .experiments.stability import OutputDirError
    from .experiments.interrupts import interrupted_exit
    from .experiments.train import DataSizeError, ResumeError, TrainingInterrupted, train_digits
    from .extras import MissingExtraError
    from .serialization import CheckpointError, check_save_path
    first = not args.ddp or distributed.rank() == 0
    line = choose_backend("train", args.backend)
    try:
        if args.save and first:
            check_save_path(args.save)
    except OSError as e:
        print(f"miniflow train: --save {args.save}: {e}", file=sys.stderr)
        return 2
    if args.logdir and first:
        try:                        # before the first step, as --save: one line naming --logdir
            _check_logdir(args.logdir, "miniflow train --logdir")
        except (OutputDirError, MissingExtraError) as e:
            print(f"miniflow train: {e}", file=sys.stderr)
            return 2
    if args.model == "gpt":
        from .cli_gpt import train_gpt_command
        return train_gpt_command(args, line if first else None, threads)
    if first:
        print(line, flush=True)
    try:
        r = train_digits(args.model, epochs=args.epochs, batch_size=args.batch_size,
                         lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay,
                         lr_schedule=args.lr_schedule, hidden=args.hidden or 128,
                         seed=args.seed, progress=not args.no_progress,
                         accumulate=args.accumulate, clip_norm=args.clip_norm,
                         amp=args.amp, checkpoint=args.checkpoint,
                         resume=args.resume, checkpoint_every=args.checkpoint_every or 100,
                         ddp=args.ddp, logdir=args.logdir)
    except (ResumeError, CheckpointError, OSError, MissingExtraError, DataSizeError) as e:
        print(f"miniflow train: {e}", file=sys.stderr)
        return 2
    except NonFiniteGradientsError as e:    # the run diverged: a message, not a traceback
        print(f"miniflow train: {e}", file=sys.stderr)
        return 1
    except MemoryError as e:            # the MLP's width is the user's choice too
        sizes = "--batch-size or --hidden" if args.model == "mlp" else "--batch-size"
        print(f"miniflow train: out of memory ({e}): give a smaller {sizes}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:
        return interrupted_exit("train", e, report=first)
    if r["rank"] == 0:
        _print_training(r, args, threads if args.ddp else None)
        why = _diverged(r)
        if why:             # as a GPT run whose weights diverged (no sample): exit code 1
            print(f"miniflow train: the run diverged: {why}; train with a smaller --lr, or "
                  "clip with --clip-norm", file=sys.stderr)
            return 1
    return 0


def _diverged(r: dict) -> str | None:
    """Why the run ``r`` (``train_digits``' result) diverged: tensors of the model that hold
    NaN or inf, or a final loss that is not finite (under AMP with a grad scaler the weights
    stay finite, while the float16 forward overflows and every step is skipped); None when it
    did not."""
    import numpy as np
    bad = [k for k, v in r["model"].state_dict().items()
           if v.dtype.kind == "f" and not np.isfinite(v).all()]
    if bad:
        return (f"{len(bad)} of the model's tensors hold NaN or inf ({', '.join(bad[:3])}"
                f"{' ...' if len(bad) > 3 else ''})")
    if r["losses"] and not math.isfinite(r["losses"][-1]):
        return f"the final loss is {r['losses'][-1]}"
    return None


def _print_training(r: dict, args, threads: int | None) -> None:
    """What ``miniflow train`` prints after the run (rank 0): the settings, the losses and
    accuracies, the loss scale, the time, the files written; ``--save`` writes the model."""
    run_steps = r["steps"] - (r["resumed_from"] or 0)
    print(_model_line(args.model, r, args))
    if args.ddp:
        print(f"data parallel: world size {r['world_size']}, batch {r['batch_rows']} per rank "
              f"({r['batch_rows'] * r['world_size']} per step), {threads} thread(s) per rank")
    if r["resumed_from"] is not None:
        print(f"resumed from step {r['resumed_from']} ({r['checkpoint']})")
    if r["losses"]:
        print(f"final loss: {r['losses'][-1]:.4f}" + (" (rank 0's batch)" if args.ddp else ""))
    print(f"train accuracy: {100 * r['train_accuracy']:.2f}%")
    print(f"test accuracy: {100 * r['test_accuracy']:.2f}% (360 test images)")
    if r["scaler"] is not None:
        from .experiments.train import scaler_line
        print(scaler_line(r["scaler"]))
    print(f"time: {r['seconds']:.1f} s for {run_steps} steps")
    if r["checkpoint"] is not None:
        print(f"checkpoint: {r['checkpoint']} (step {r['steps']})")
    if r["logdir"] is not None:
        from .experiments.train import tensorboard_command
        print(f"TensorBoard run: {r['logdir']} ({tensorboard_command(args.logdir)})")
    if args.save:
        from .serialization import save
        save(r["graph"].model.state_dict(), args.save)
        print(f"saved the model's state_dict to {args.save}")


def _model_line(model: str, r: dict, args) -> str:
    """``model: lenet, 1 epoch of SGD (lr 0.05, ...), float32``: the settings of the run ``r``
    (``train_digits``' result). The batch is the one the run used: a ``--batch-size`` above
    the rows of an epoch (a rank's shard under ``--ddp``) gives batches of all of them, as
    PyTorch's ``DataLoader`` does, which the line says."""
    from .experiments.train import AMP_LINES, accumulated, clipped
    recipe, rows = r["recipe"], r["batch_rows"]
    epochs = f"{recipe.epochs} epoch{'' if recipe.epochs == 1 else 's'}"
    batch = f"batch {rows}{accumulated(rows, args.accumulate)}"
    if recipe.batch_size > r["epoch_rows"]:
        share = "a rank's shard" if args.ddp else "the training set"
        batch += (f" (--batch-size {recipe.batch_size} is more than the {r['epoch_rows']} rows "
                  f"of {share})")
    return (f"model: {model}, {epochs} of SGD (lr {recipe.lr:g}, {recipe.lr_schedule} schedule, "
            f"momentum {recipe.momentum:g}, weight decay {recipe.weight_decay:g}, "
            f"{batch}{clipped(args.clip_norm)}), " + AMP_LINES[args.amp])


@contextlib.contextmanager
def _pinned_threads(local_ranks: int):
    """Give each of the ``local_ranks`` ranks on this machine its share of the cores while the
    block runs: Numba's and the BLAS's thread pools get ``cores // local_ranks`` threads (at
    least 1; yielded), ``cores`` those the process may run on (its CPU affinity: ``taskset``,
    a batch system's or container's CPU set, a launcher's binding; ``kernels.cpu.team.cores``),
    so ranks never share a core with another rank's pool (MPICH busy-polls while a rank waits).
    Both pools get their thread counts back when the block ends, so :func:`main` called
    in-process (a test, a notebook) leaves the caller's threads as they were
    (``kernels.cpu.common.pinned_threads``)."""
    from .kernels.cpu.common import pinned_threads  # first: it picks Numba's threading layer
    from .kernels.cpu.team import cores

    n = max(1, len(cores()) // local_ranks)
    with pinned_threads(n):
        yield n


def _stability(args) -> int:
    """The training-stability study (``miniflow.experiments.stability``). Ctrl-C during the runs
    is one line saying what was written, and exit code 130, as ``train``'s; SIGTERM the same
    line after 'SIGTERM: ' and exit code 143."""
    import dataclasses
    import time
    from pathlib import Path

    from .experiments import stability
    from .experiments.stability_report import headline_table
    from .extras import MissingExtraError

    print(choose_backend("stability", args.backend), flush=True)
    cfg = stability.QUICK if args.quick else stability.StudyConfig()
    cfg = dataclasses.replace(cfg, seeds=args.seeds or cfg.seeds, steps=args.steps or cfg.steps)
    out = Path(args.out)
    try:                               # before any run (the study takes minutes) or folder
        if args.logdir:
            _check_logdir(args.logdir, "miniflow stability --logdir")
        stability.check_out_dir(out, files=stability.OUTPUT_FILES)
    except (stability.OutputDirError, MissingExtraError) as e:
        print(f"miniflow stability: {e}", file=sys.stderr)
        return 2
    started = time.time()
    try:
        metrics = stability.run_study(cfg, out, logdir=args.logdir)
    except MissingExtraError as e:
        print(f"miniflow stability: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:     # one line, as train's, not the run's traceback
        from .experiments.interrupts import interrupted_exit
        return interrupted_exit("stability", e, _unfinished_study(out, args.logdir, started))
    print(headline_table(metrics))
    print(f"{len(metrics['runs'])} runs in {metrics['config']['seconds']:.0f} s; figures, "
          f"metrics.json and summary.md in {out}/")
    if args.logdir:
        from .experiments.train import tensorboard_command
        print(f"TensorBoard: one run per experiment, policy, scale and seed in {args.logdir}/ "
              f"({tensorboard_command(args.logdir)})")
    return 0


def _unfinished_study(out, logdir: str | None, started: float) -> str:
    """What ``miniflow stability`` says after an interrupt of the study started at time
    ``started``: what it wrote into ``out`` (the files written since; each is whole, written
    atomically) and what not, and where the TensorBoard scalars of the runs are."""
    from .experiments.stability import OUTPUT_FILES
    written = [f for f in OUTPUT_FILES
               if (out / f).is_file() and (out / f).stat().st_mtime >= started]
    logs = (f"; the TensorBoard scalars of the runs done so far are in {logdir}/"
            if logdir else "")
    if not written:
        return (f"interrupted before the study finished: its {', '.join(OUTPUT_FILES[:2])} and "
                f"figures are written to {out}/ only when every run has finished{logs}; run it "
                "again to start over")
    left = [f for f in OUTPUT_FILES if f not in written]
    return (f"interrupted while writing the results of the finished runs to {out}/: "
            f"{', '.join(written)} written, {', '.join(left)} not{logs}; run it again to start "
            "over")


def _check_logdir(logdir: str, feature: str) -> None:
    """Check a ``--logdir`` before a run: the tensorboard extra is installed (before any folder
    is made), then ``logdir`` is made if missing and written to (``stability.check_out_dir``).

    Raises:
        MissingExtraError: no tensorboardX (naming ``feature`` and the extra).
        OutputDirError: ``logdir`` is a file, lies under a file or cannot be written (naming
            ``--logdir``, the folder and the reason).
    """
    from pathlib import Path

    from .experiments.stability import check_out_dir
    from .extras import require
    require("tensorboardX", "tensorboard", feature)
    check_out_dir(Path(logdir), "TensorBoard's logs", "--logdir")


def _ir(args) -> int:
    """Print a model's IR at a stage of the pass pipeline; with ``--onnx`` export it, with
    ``--netron`` open it in Netron (``miniflow.experiments.show_ir``). A bad ``--after`` or
    ``--onnx`` path is one line and exit code 2, a ``--batch-size`` too large for the memory
    one line and exit code 1, as ``train``'s."""
    from .experiments.show_ir import serve_netron, show_ir
    from .extras import MissingExtraError, require
    from .onnx import OnnxExportError
    try:
        if args.netron:      # before the export writes its file
            require("netron", "netron", "miniflow ir --netron")
        print(show_ir(args.model, amp=args.amp, eval=args.eval, after=args.after,
                      onnx_path=args.onnx, batch_size=args.batch_size))
        if args.netron:
            serve_netron(args.onnx)
    except BrokenPipeError:     # stdout closed early (| head): the closed-stdout exit, 141
        raise
    except (ValueError, MissingExtraError, OnnxExportError, OSError) as e:
        print(f"miniflow ir: {e}", file=sys.stderr)      # OSError: the --onnx path (named)
        return 2
    except MemoryError as e:        # the example batch: NumPy's names the size
        print(f"miniflow ir: out of memory ({e}): give a smaller --batch-size", file=sys.stderr)
        return 1
    return 0


def _integer(low: int):
    """argparse type: an integer >= ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value
    return parse


_positive = _integer(1)
"""argparse type: an integer >= 1."""
_seed = _integer(0)
"""argparse type: a seed, an integer >= 0 (``miniflow.manual_seed``; NumPy takes no negative
seeds)."""


def _real(low: float, low_inclusive: bool):
    """argparse type: a finite float above ``low`` (or at it when ``low_inclusive``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        ok = math.isfinite(value) and (value >= low if low_inclusive else value > low)
        if not ok:
            bound = f">= {low:g}" if low_inclusive else f"> {low:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
        return value
    return parse


PATH_OPTIONS = {"train": ("save", "checkpoint", "logdir"), "stability": ("out", "logdir"),
                "ir": ("onnx",), "attention-study": ("out",)}
"""The options of each subcommand that name a file or folder (``args`` attributes)."""


def _check_paths(args) -> None:
    """A usage error (exit code 2) for a path option given as an empty string (an unset shell
    variable: ``--out "$DIR"``), which would otherwise mean the working folder (``Path("")``
    is ``.``) or be refused late with a message about a folder named ``''``."""
    for option in PATH_OPTIONS.get(args.command, ()):
        if getattr(args, option) == "":
            args.parser.error(f"--{option} needs a path, got an empty one")


def _check_train_args(args) -> None:
    """Usage errors (exit code 2) between ``miniflow train``'s options: an option that would
    be ignored, or a ``--save`` that would replace a file of the ``--checkpoint`` folder."""
    import os
    if args.resume and args.checkpoint is None:
        args.parser.error("--resume needs --checkpoint DIR (the folder of the run to continue)")
    if args.checkpoint_every is not None and args.checkpoint is None:
        args.parser.error("--checkpoint-every needs --checkpoint DIR (without it no checkpoint "
                          "is saved)")
    from .distributed import announced_world_size
    ranks = announced_world_size()
    if not args.ddp and ranks is not None and ranks > 1:
        args.parser.error(f"started by a launcher with {ranks} ranks (mpiexec -n {ranks}) but "
                          "without --ddp: every rank would train a copy of the same run on its "
                          "own; add --ddp to train one model data parallel, or start one process")
    if args.hidden is not None and args.model != "mlp":
        args.parser.error(f"--hidden sets the MLP's hidden units; --model {args.model} has a "
                          "fixed architecture (drop --hidden)")
    if args.save and args.checkpoint:
        from .experiments.run_folder import CHECKPOINT_FILE, LOCK_FILE, LOSS_LOG
        own = {os.path.realpath(os.path.join(args.checkpoint, f)): f
               for f in (CHECKPOINT_FILE, LOCK_FILE, LOSS_LOG)}
        name = own.get(os.path.realpath(args.save))
        if os.path.realpath(args.save) == os.path.realpath(args.checkpoint):
            name = "folder itself"
        if name is not None:
            args.parser.error(f"--save {args.save} would replace the run's {name} in "
                              f"--checkpoint {args.checkpoint} (and --resume could not continue "
                              "the run): save the model elsewhere")
    from .cli_gpt import check_gpt_args
    check_gpt_args(args)            # the GPT's options, or none of them for another model
    if args.model == "gpt":
        return
    from .experiments.train import RECIPES
    batch = args.batch_size or RECIPES[args.model].batch_size
    if batch % args.accumulate:
        args.parser.error(f"--batch-size {batch} must be a multiple of --accumulate "
                          f"{args.accumulate} (equal micro-batches)")


def _check_ir_args(args) -> None:
    """Usage errors (exit code 2) between ``miniflow ir``'s options: ``--netron`` without the
    file it opens, and ``--eval --after`` a training pass (the evaluation graph has no
    gradients or updates: it would print the graph unchanged), naming the passes that apply."""
    from .passes.pipeline import STAGE_ALIASES, TRAINING_PASSES
    if args.netron and not args.onnx:
        args.parser.error("--netron needs --onnx PATH (the file Netron opens)")
    if args.eval and STAGE_ALIASES.get(args.after, args.after) in TRAINING_PASSES:
        args.parser.error(f"--after {args.after}: the evaluation graph (--eval) has no "
                          f"gradients or updates, so {args.after} leaves it unchanged; give "
                          f"trace or one of {_pass_names(TRAINING_PASSES)}, or drop --eval for "
                          "the training step")


def _pass_names(leave_out=()) -> str:
    """The pipeline's passes but ``leave_out``, in order, with their short names: ``autograd,
    auto_mixed_precision (amp), ...``."""
    from .passes.pipeline import PASSES, STAGE_ALIASES
    short = {full: alias for alias, full in STAGE_ALIASES.items()}
    return ", ".join(f"{name} ({short[name]})" if name in short else name
                     for name, _ in PASSES if name not in leave_out)


def parser() -> argparse.ArgumentParser:
    """The parser of ``miniflow`` and its subcommands (their ``--help``)."""
    from . import __version__
    p = argparse.ArgumentParser(
        prog="miniflow", description="a small lazy-graph DL framework",
        epilog="exit codes: 0 done; 1 a run diverged or ran out of memory (info: no usable "
               "backend); 2 a usage error: an option, a path, a MINIFLOW_* value; 130 Ctrl-C; "
               "141 stdout closed early (| head); 143 SIGTERM; 1, 2, 130 and 143 with one line "
               "on stderr")
    p.add_argument("--version", action="version", version=f"miniflow {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backend, versions, GPU, float16 path, kernel cache").set_defaults(
        fn=_info)
    _add_train(sub)
    _add_stability(sub)
    _add_ir(sub)
    from .cli_gpt import add_attention_study
    add_attention_study(sub)
    return p


def _add_train(sub) -> None:
    """``miniflow train`` and its options: the model and its recipe, then the run's."""
    from .experiments.train import MODELS
    t = sub.add_parser("train", help="train a model (mlp, lenet, resnet18) on the digits data "
                       "set, or a character-level GPT (gpt) on text")
    t.add_argument("--model", choices=MODELS + ("gpt",), default="mlp",
                   help="mlp: 64-128-10; lenet: a LeNet with batch norm; resnet18: ResNet-18 with "
                        "the small-input stem; gpt: a character-level GPT on the standard "
                        "library's source (default mlp)")
    t.add_argument("--epochs", type=_positive, help=_per_model("epochs"))
    t.add_argument("--batch-size", type=_positive, help="default 64 (gpt: 32)")
    t.add_argument("--lr", type=_real(0.0, False), help=_per_model("lr"))
    t.add_argument("--momentum", type=_real(0.0, True), help="default 0.9 (SGD's; gpt trains "
                   "with AdamW)")
    t.add_argument("--weight-decay", type=_real(0.0, True), help=_per_model("weight_decay"))
    t.add_argument("--hidden", type=_positive, help="the MLP's hidden units (default 128; "
                   "--model mlp only)")
    t.add_argument("--amp", nargs="?", const="fp16", choices=("fp16", "bf16"),
                   help="mixed precision: fp16 (the default of a bare --amp) with a dynamic "
                        "GradScaler, or bf16 without loss scaling (default: float32)")
    t.add_argument("--seed", type=_seed, default=0, help="any integer >= 0 (default 0)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_train_run_options(t)
    from .cli_gpt import add_gpt_arguments
    add_gpt_arguments(t, _positive, _real)
    t.set_defaults(fn=_train, parser=t)


def _per_model(key: str) -> str:
    """``--help``'s "default per model: mlp 20, ..., gpt 6" for a recipe field: the digits
    models' ``RECIPES`` and ``--model gpt``'s ``GPT_DEFAULTS``."""
    from .experiments.train import RECIPES
    from .experiments.train_gpt import GPT_DEFAULTS
    values = {**{m: getattr(r, key) for m, r in RECIPES.items()}, "gpt": GPT_DEFAULTS[key]}
    return "default per model: " + ", ".join(
        f"{m} {v:g}" if isinstance(v, float) else f"{m} {v}" for m, v in values.items())


def _add_train_run_options(t) -> None:
    """``miniflow train``'s options after ``--no-progress``: data parallel, the saved model,
    the schedule, accumulation, clipping, checkpoints, the backend and the log."""
    from .experiments.train import SCHEDULES
    t.add_argument("--ddp", action="store_true", help="data parallel on every rank of "
                   "`mpiexec -n N miniflow train --ddp` (--batch-size is per rank)")
    t.add_argument("--save", metavar="PATH", help="write the trained model's state_dict (a "
                   "miniflow.save checkpoint) to PATH, a regular file or a new one (checked "
                   "before the first step; default: not saved)")
    t.add_argument("--lr-schedule", choices=list(SCHEDULES),
                   help="how the lr changes over the run, stepped once per update (a step the "
                   "grad scaler skips does not count; "
                   + _per_model("lr_schedule") + "): "
                   + "; ".join(f"{k}: {v}" for k, v in SCHEDULES.items()).replace("%", "%%"))
    t.add_argument("--accumulate", type=_positive, default=1, metavar="N",
                   help="gradient accumulation: run every batch as N micro-batches and one "
                   "update (the memory of a micro-batch, the update of the batch; "
                   "--batch-size must be a multiple of N; default 1: no accumulation)")
    t.add_argument("--clip-norm", type=_real(0.0, False), metavar="X",
                   help="clip the gradients to a total L2 norm of at most X before each update "
                   "(the optimizer's clip_grad_max_norm; default: no clipping)")
    t.add_argument("--checkpoint", metavar="DIR", help="save the training state (model, "
                   "optimizer, grad scaler, LR scheduler, step, data order, random state) to "
                   "DIR/checkpoint.safetensors every --checkpoint-every updates, at the end and "
                   "at Ctrl-C or SIGTERM, and every update's loss to DIR/losses.csv; written "
                   "atomically: a crash during a save keeps the previous checkpoint; "
                   "DIR/checkpoint.lock keeps a second run out of DIR (default: no checkpoint)")
    t.add_argument("--checkpoint-every", type=_positive, metavar="STEPS",
                   help="updates between checkpoints (default 100; needs --checkpoint)")
    t.add_argument("--resume", action="store_true", help="continue the run saved in "
                   "--checkpoint DIR (same options as that run); the rest of the run is "
                   "bit-identical to an uninterrupted one")
    t.add_argument("--backend", choices=["cpu", "cuda"], help="default: MINIFLOW_BACKEND, "
                   "else cpu (faster than cuda for this small MLP; the first line printed says "
                   "which and why)")
    t.add_argument("--logdir", metavar="DIR", help="TensorBoard scalars (per step: loss, lr, "
                   "gradient norm, loss scale, skipped steps; per epoch: test accuracy, or the "
                   "GPT's validation loss) in a "
                   "run folder named after the settings in DIR (needs the tensorboard extra; default: "
                   "none written)")


def _add_stability(sub) -> None:
    """``miniflow stability`` and its options."""
    st = sub.add_parser("stability", help="training-stability study of the loss-scale policies: "
                        "figures, metrics.json, summary.md")
    st.add_argument("--quick", action="store_true", help="1 seed, 220 steps per run (for CI)")
    st.add_argument("--out", default="stability-results", help="output folder (default "
                    "stability-results)")
    st.add_argument("--seeds", type=_positive, help="seeds 0..N-1 of every run (default 3; "
                    "--quick: 1)")
    st.add_argument("--steps", type=_positive, help="steps per run, any number >= 1 (default "
                    "660 = 30 epochs of 22 steps; --quick: 220)")
    st.add_argument("--backend", choices=["cpu", "cuda"], help="default: MINIFLOW_BACKEND, "
                    "else cpu (faster than cuda for this study's small MLPs; the first line "
                    "printed says which and why)")
    st.add_argument("--logdir", metavar="DIR", help="TensorBoard scalars of every run (one "
                    "run folder per experiment, policy or label, scale and seed) in DIR (needs "
                    "the tensorboard extra; default: none written)")
    st.set_defaults(fn=_stability, parser=st)


def _add_ir(sub) -> None:
    """``miniflow ir`` and its options."""
    from .experiments.train import MODELS
    from .passes.pipeline import TRAINING_PASSES
    ir = sub.add_parser("ir", help="print a model's IR after a pass; --onnx exports it, "
                        "--netron opens it in Netron")
    ir.add_argument("--model", choices=MODELS + ("gpt",), default="mlp",
                    help="a digits model of train, or gpt: train --model gpt's character-level "
                         "GPT with its default settings (default mlp)")
    ir.add_argument("--after", metavar="STAGE", help=f"trace, or a pass: {_pass_names()} "
                    "(default: every pass; an AMP pass turns --amp on)")
    ir.add_argument("--amp", action="store_true", help="mixed precision (float16); the "
                    "training step with a dynamic GradScaler")
    ir.add_argument("--eval", action="store_true", help="the evaluation graph, not the "
                    "training step (--after: trace or one of "
                    f"{_pass_names(TRAINING_PASSES)})")
    ir.add_argument("--batch-size", type=_positive, help="default 64 (gpt: 32)")
    ir.add_argument("--onnx", metavar="PATH", help="also write the graph at that stage to PATH "
                    "as ONNX (miniflow-only ops in the ai.miniflow domain; needs the onnx extra; "
                    "default: no file)")
    ir.add_argument("--netron", action="store_true", help="open the --onnx file in Netron "
                    "(needs the netron extra)")
    ir.set_defaults(fn=_ir, parser=ir)


def main(argv=None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit code (130 after Ctrl-C, 143 after
    SIGTERM, with one line on stderr and no traceback; 141 when stdout was closed early)."""
    args = parser().parse_args(argv)
    _check_paths(args)
    if args.command == "train":
        _check_train_args(args)
    if args.command == "ir":
        _check_ir_args(args)
    from .environment import EnvironmentValueError, check
    try:                            # (import miniflow checked them; a caller may have changed one)
        check()
    except EnvironmentValueError as e:  # a bad MINIFLOW_* value: one line, not a traceback
        print(e, file=sys.stderr)
        return 2
    from .experiments.interrupts import (interrupt_signals, interrupted_exit,
                                         quiet_on_closed_stdout)
    from .runtime.backend import BackendUnavailableError
    try:
        with interrupt_signals():   # SIGTERM as Ctrl-C: a KeyboardInterrupt, not the end
            code = quiet_on_closed_stdout(args.fn, args)    # miniflow info | head -1
    except BackendUnavailableError as e:    # MINIFLOW_BACKEND=cuda without a GPU: one line
        print(e, file=sys.stderr)
        code = 2
    except KeyboardInterrupt as e:  # a subcommand that does not report it: one line
        code = interrupted_exit(args.command, e, "interrupted")
    if code:
        from . import distributed
        distributed.abort(code)
    return code


if __name__ == "__main__":        # python -m miniflow.cli, as python -m miniflow
    raise SystemExit(main())
