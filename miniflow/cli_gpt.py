"""``miniflow train --model gpt``: its extra options and its run (``miniflow.experiments.
train_gpt``), kept apart from the digits models' ``train`` code in ``miniflow.cli``, which calls
:func:`add_gpt_arguments`, :func:`check_gpt_args` and :func:`train_gpt_command`; and the
``miniflow attention-study`` subcommand (:func:`add_attention_study`)."""
from __future__ import annotations

import sys

__all__ = ["add_gpt_arguments", "check_gpt_args", "train_gpt_command", "add_attention_study"]


def add_gpt_arguments(parser, positive, real) -> None:
    """The options only ``--model gpt`` reads (``positive`` / ``real``: the CLI's checked
    number types)."""
    g = parser.add_argument_group("--model gpt (a character-level GPT on the standard library's "
                                  "source)")
    g.add_argument("--steps-per-epoch", type=positive, help="updates per epoch (default 250)")
    g.add_argument("--block-size", type=positive, help="context length (default 64)")
    g.add_argument("--sample", type=int, metavar="N",
                   help="characters generated and printed at the end (default 200; 0: none)")
    g.add_argument("--temperature", type=real(0.0, False),
                   help="sampling temperature (default 0.8)")
    g.add_argument("--top-k", type=positive, help="sample from the k likeliest characters only (default: all)")


GPT_ONLY = ("steps_per_epoch", "block_size", "sample", "temperature", "top_k")
"""The options (``args`` attributes) only ``--model gpt`` reads."""


def check_gpt_args(args) -> None:
    """Usage errors of ``--model gpt`` (exit code 2), and the sampling defaults filled in; for
    another model, one of :data:`GPT_ONLY` given."""
    if args.model != "gpt":
        given = [k for k in GPT_ONLY if getattr(args, k) is not None]
        if given:
            args.parser.error(f"--{given[0].replace('_', '-')} is an option of --model gpt; "
                              f"--model {args.model} does not read it (drop it)")
        return
    if args.momentum is not None:
        args.parser.error("--model gpt trains with AdamW: --momentum does not apply")
    args.sample = 200 if args.sample is None else args.sample
    args.temperature = 0.8 if args.temperature is None else args.temperature
    if args.sample < 0:
        args.parser.error(f"--sample must be >= 0, got {args.sample}")
    from .experiments.train_gpt import GPT_DEFAULTS
    batch = args.batch_size or GPT_DEFAULTS["batch_size"]
    if batch % args.accumulate:
        args.parser.error(f"--batch-size {batch} must be a multiple of --accumulate "
                          f"{args.accumulate} (equal micro-batches)")


def train_gpt_command(args, backend_line: str | None, threads: int | None = None) -> int:
    """Run ``miniflow train --model gpt`` with ``args``; prints the backend line, the validation
    loss per epoch, the result and the sample (under ``--ddp`` rank 0 alone: the other ranks
    get ``backend_line`` None; ``threads``: each rank's thread count). A checkpoint that cannot
    be used (and a usage error ``train_gpt`` finds: a context longer than the text) is a
    message and exit code 2, a run that diverged (``NonFiniteGradientsError``) or ran out of
    memory a message and exit code 1, Ctrl-C one line and exit code 130 (SIGTERM: 143); a run
    whose weights diverged to NaN or inf prints its results and, for the sample, one line and
    exit code 1."""
    from .amp import NonFiniteGradientsError
    from .experiments.interrupts import interrupted_exit
    from .experiments.train import ResumeError, TrainingInterrupted
    from .experiments.train_gpt import train_gpt
    from .extras import MissingExtraError
    from .serialization import CheckpointError
    if backend_line is not None:
        print(backend_line, flush=True)
    try:
        r = train_gpt(epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                      batch_size=args.batch_size, block_size=args.block_size, lr=args.lr,
                      weight_decay=args.weight_decay, lr_schedule=args.lr_schedule,
                      clip_norm=args.clip_norm, accumulate=args.accumulate, amp=args.amp,
                      seed=args.seed, checkpoint=args.checkpoint, resume=args.resume,
                      checkpoint_every=args.checkpoint_every or 100, sample=args.sample,
                      temperature=args.temperature, top_k=args.top_k,
                      progress=not args.no_progress, ddp=args.ddp, logdir=args.logdir)
    except (ResumeError, CheckpointError, OSError, MissingExtraError, ValueError) as e:
        print(f"miniflow train: {e}", file=sys.stderr)
        return 2
    except NonFiniteGradientsError as e:
        print(f"miniflow train: {e}", file=sys.stderr)
        return 1
    except MemoryError as e:            # NumPy's names the size it could not allocate
        print(f"miniflow train: out of memory ({e}): give a smaller --batch-size or "
              "--block-size", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:
        return interrupted_exit("train", e, report=backend_line is not None)
    return _print_gpt_run(r, args, threads) if r["rank"] == 0 else 0


def _print_gpt_run(r: dict, args, threads: int | None) -> int:
    """What ``miniflow train --model gpt`` prints after the run ``r`` (``train_gpt``'s result;
    rank 0): the settings, the loss, the scale, the time, the files written (``--save`` writes
    the model) and the sample. Returns the exit code: 1 when the weights diverged and there is
    no sample, else 0."""
    from .experiments.train import (AMP_LINES, accumulated, clipped, scaler_line,
                                    tensorboard_command)
    c = r["config"]
    print(f"model: gpt ({c['n_layer']} layers, {c['n_head']} heads, {c['n_embd']} wide, context "
          f"{c['block_size']}, {r['parameters']} parameters), {r['steps']} AdamW updates (lr "
          f"{c['lr']:g}, {c['lr_schedule']} schedule, weight decay {c['weight_decay']:g}, batch "
          f"{c['batch_size']}{accumulated(c['batch_size'], args.accumulate)}"
          f"{clipped(args.clip_norm)}), " + AMP_LINES[args.amp])
    if args.ddp:
        print(f"data parallel: world size {r['world_size']}, batch {c['batch_size']} per rank "
              f"({c['batch_size'] * r['world_size']} per step), {threads} thread(s) per rank")
    if r["resumed_from"] is not None:
        print(f"resumed from step {r['resumed_from']} ({r['checkpoint']})")
    if r["val_losses"]:
        print(f"validation loss: {r['val_losses'][-1]:.4f} nats/char (unigram model: "
              f"{r['unigram']:.4f}; ratio {r['val_losses'][-1] / r['unigram']:.2f})")
    if r["scaler"] is not None:             # --amp fp16: as the digits models print it
        print(scaler_line(r["scaler"]))
    print(f"time: {r['seconds']:.1f} s")
    if r["checkpoint"] is not None:
        print(f"checkpoint: {r['checkpoint']} (step {r['steps']})")
    if r["logdir"] is not None:
        print(f"TensorBoard run: {r['logdir']} ({tensorboard_command(args.logdir)})")
    if args.save:
        from .serialization import save
        save(r["model"].state_dict(), args.save)
        print(f"saved the model's state_dict to {args.save}")
    if r["sample"] is not None:
        print("sample:\n" + r["sample"])
    if r["sample_error"] is not None:       # the run diverged: its results above, no sample
        print(f"miniflow train: no sample: {r['sample_error']} (train with a smaller --lr)",
              file=sys.stderr)
        return 1
    return 0


def add_attention_study(sub) -> None:
    """The ``attention-study`` subcommand (``miniflow.experiments.attention_study``)."""
    a = sub.add_parser("attention-study", help="AMP in attention: the IR of a head under AMP, "
                       "float16 softmax error and overflow against the score scale, "
                       "amp_black_identity's effect, a figure")
    a.add_argument("--out", default="attention-study-results", help="output folder (default attention-study-results)")
    a.set_defaults(fn=_attention_study, parser=a)


def _attention_study(args) -> int:
    """Run the study (``miniflow.experiments.attention_study``): print the IR and the table,
    write ``results.json`` and the figure into ``--out``. Ctrl-C is one line saying what was
    written, and exit code 130; SIGTERM the same line after 'SIGTERM: ' and exit code 143."""
    from pathlib import Path

    from .experiments.attention_study import OUTPUT_FILES
    from .experiments.interrupts import interrupted_exit
    from .experiments.stability import OutputDirError, check_out_dir
    try:                # before the study: a clear error, not a traceback
        check_out_dir(Path(args.out), files=OUTPUT_FILES)
    except OutputDirError as e:
        print(f"miniflow attention-study: {e}", file=sys.stderr)
        return 2
    written = []
    try:
        _attention_run(args.out, written)
    except KeyboardInterrupt as e:
        done = ("results.json is written, its figure attention_amp.png is not" if written else
                "nothing is written (results.json and its figure come at the end)")
        return interrupted_exit("attention-study", e, "interrupted before the study finished: "
                                f"{done} in {args.out}/; run it again")
    return 0


def _attention_run(out: str, written: list) -> None:
    """:func:`_attention_study` after its checks; appends the name of each file written to
    ``written``."""
    import json
    import os

    from .experiments.attention_study import (OUTPUT_FILES, SCALES, figure, ir_text, study,
                                              summary)
    from .serialization import write_atomic
    print("# the attention head under AMP (OneFlow's lists): softmax between two batch_matmuls")
    print(ir_text("amp"))
    results = study()
    print(f"\n{'score std':>10}  " + "  ".join(f"{v:>17}" for v in results))
    for i, s in enumerate(SCALES):
        cells = ["inf/NaN" if results[v][i]["nonfinite"] else f"{results[v][i]['out_error']:.2e}"
                 for v in results]
        print(f"{s:>10g}  " + "  ".join(f"{c:>17}" for c in cells))
    print()
    for line in summary(results):
        print(line)
    results_file, figure_file = OUTPUT_FILES
    write_atomic(os.path.join(out, results_file), json.dumps(
        {"scales": list(SCALES), "results": results}, indent=1).encode(),
        "miniflow attention-study", results_file)       # never a part of one
    written.append(results_file)
    print(f"figure: {figure(results, os.path.join(out, figure_file))}")
