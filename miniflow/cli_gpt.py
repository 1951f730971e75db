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
    g.add_argument("--sample", type=int, default=200, metavar="N",
                   help="characters generated and printed at the end (default 200; 0: none)")
    g.add_argument("--temperature", type=real(0.0, False), default=0.8,
                   help="sampling temperature (default 0.8)")
    g.add_argument("--top-k", type=positive, help="sample from the k likeliest characters only (default: all)")


def check_gpt_args(args) -> None:
    """Usage errors of ``--model gpt`` (exit code 2)."""
    if args.momentum is not None:
        args.parser.error("--model gpt trains with AdamW: --momentum does not apply")
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
    be used is a message and exit code 2."""
    from .experiments.train import AMP_LINES, ResumeError
    from .experiments.train_gpt import train_gpt
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
                      progress=not args.no_progress, ddp=args.ddp)
    except (ResumeError, CheckpointError, OSError) as e:
        print(f"miniflow train: {e}", file=sys.stderr)
        return 2
    if r["rank"] != 0:
        return 0
    c = r["config"]
    print(f"model: gpt ({c['n_layer']} layers, {c['n_head']} heads, {c['n_embd']} wide, context "
          f"{c['block_size']}, {r['parameters']} parameters), {r['steps']} AdamW updates (lr "
          f"{c['lr']:g}, {c['lr_schedule']} schedule, weight decay {c['weight_decay']:g}, batch "
          f"{c['batch_size']}), " + AMP_LINES[args.amp])
    if args.ddp:
        print(f"data parallel: world size {r['world_size']}, batch {c['batch_size']} per rank "
              f"({c['batch_size'] * r['world_size']} per step), {threads} thread(s) per rank")
    if r["resumed_from"] is not None:
        print(f"resumed from step {r['resumed_from']} ({r['checkpoint']})")
    if r["val_losses"]:
        print(f"validation loss: {r['val_losses'][-1]:.4f} nats/char (unigram model: "
              f"{r['unigram']:.4f}; ratio {r['val_losses'][-1] / r['unigram']:.2f})")
    print(f"time: {r['seconds']:.1f} s")
    if r["checkpoint"] is not None:
        print(f"checkpoint: {r['checkpoint']} (step {r['steps']})")
    if args.save:
        from .serialization import save
        save(r["model"].state_dict(), args.save)
        print(f"saved the model's state_dict to {args.save}")
    if r["sample"] is not None:
        print("sample:\n" + r["sample"])
    return 0


def add_attention_study(sub) -> None:
    """The ``attention-study`` subcommand (``miniflow.experiments.attention_study``)."""
    a = sub.add_parser("attention-study", help="AMP in attention: the IR of a head under AMP, "
                       "float16 softmax error and overflow against the score scale, "
                       "amp_black_identity's effect, a figure")
    a.add_argument("--out", default="attention-study-results", help="output folder (default attention-study-results)")
    a.set_defaults(fn=_attention_study)


def _attention_study(args) -> int:
    import json
    import os

    from .experiments.attention_study import SCALES, figure, ir_text, study, summary
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
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"scales": list(SCALES), "results": results}, f, indent=1)
    print(f"figure: {figure(results, os.path.join(args.out, 'attention_amp.png'))}")
    return 0
