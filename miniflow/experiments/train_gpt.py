"""``miniflow train --model gpt``: a character-level GPT (``miniflow.models.gpt``) trained on the
source of Python's standard library (``miniflow.data.stdlib_text``) with AdamW, in float32 or
under AMP (``fp16`` with a dynamic loss scale, or ``bf16``), printing the validation loss after
every epoch against the unigram baseline and, at the end, a sample of generated text.

An epoch is ``steps_per_epoch`` updates on random windows of the training split (offsets from
miniflow's generator); the validation loss is the mean over ``eval_batches`` fixed windows of the
validation split (the same every epoch, drawn from their own generator). The learning rate
follows a schedule of ``miniflow.experiments.train`` (default: linear warm-up, then cosine, as
nanoGPT's), the gradients can be clipped and accumulated over micro-batches, and a checkpoint
(model, optimizer, grad scaler, scheduler, the run record and the random state, dropout's stream
included) lets a later run resume bit for bit.

With ``ddp`` (``mpiexec -n N miniflow train --model gpt --ddp``) the training graph is data
parallel (``config.enable_data_parallel``: gradients all-reduced and averaged, rank 0's
parameters and optimizer state broadcast at compile time), as ``train_digits``'s: every rank
draws the same ``N * batch_size`` windows from miniflow's generator (seeded alike, so the random
state stays equal on every rank and rank 0's checkpoint resumes all of them) and trains on its
own ``batch_size`` of them, rows ``rank * batch_size`` on: the step of N ranks is the step of one
process on ``N * batch_size`` windows. Rank 0 alone evaluates, reports, writes the checkpoint
and samples.
"""
from __future__ import annotations

import os
import time

import numpy as np

from .. import distributed, models, nn, optim
from ..amp import GradScaler
from ..checks import positive_integer
from ..data import stdlib_text
from ..models.gpt import sample
from ..random import RngState, generator, manual_seed
from ..serialization import save
from ..tensor import tensor
from .interrupts import interrupt_signals
from .train import (AMP_DTYPES, TrainingInterrupted, _interrupted, _resume, _run_folder,
                    amp_mode, make_lr_schedule, named_run)

__all__ = ["GPT_DEFAULTS", "TrainGPT", "EvalGPT", "train_gpt", "generate", "run_name"]

GPT_DEFAULTS = dict(epochs=6, steps_per_epoch=250, batch_size=32, block_size=64, n_layer=2,
                    n_head=4, n_embd=96, dropout=0.0, lr=3e-3, weight_decay=0.1,
                    lr_schedule="warmup-cosine", eval_batches=20)
"""The recipe ``miniflow train --model gpt`` uses unless told otherwise: 1500 AdamW updates of
batch 32 x 64 characters on a 2-layer, 4-head, 96-wide GPT (245,760 parameters), lr 3e-3 with a
75-step linear warm-up and cosine decay. Measured (``benchmarks/gpt_recipe.py``, README there):
float32 validation loss 1.4805 nats/char, 0.467 of the unigram model's 3.1709 (0.49 after 1000
updates), in 526 CPU seconds: at most 526 s (8.8 min) of wall time on 2 idle cores; AMP float16
1.4794 (0.467; 0.08% from float32) in 445 CPU seconds."""


class TrainGPT(nn.Graph):
    """One AdamW update of ``model`` on ``(x, y)`` (token windows and their next characters);
    returns the loss."""

    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        _, loss = self.model(x, y)
        loss.backward()
        return loss


class EvalGPT(nn.Graph):
    """The loss of ``model`` on ``(x, y)`` (the model in eval mode: no dropout)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x, y):
        return self.model(x, y)[1]


def _sampling_rng(rng) -> np.random.Generator:
    """:func:`generate`'s ``rng``: miniflow's generator for None, a new one for a seed.

    Raises:
        TypeError: anything else, naming it."""
    if rng is None:
        return generator()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise TypeError(f"generate: rng must be None (miniflow's generator), a seed (an int >= 0) or "
                    f"a numpy.random.Generator, got {type(rng).__name__} {rng!r:.60}")


def generate(model, corpus, prompt: str, length: int, temperature: float = 1.0,
             top_k: int | None = None, rng=None) -> str:
    """``prompt`` continued by ``length`` characters sampled from ``model`` (eager, eval mode):
    each step the logits of the last position, divided by ``temperature``, restricted to the
    ``top_k`` largest (nanoGPT's ``generate``), softmax, one draw from ``rng`` (default:
    miniflow's generator; a ``numpy.random.Generator``, or an int seed: the draws of
    ``np.random.default_rng(seed)``). The context is the last ``block_size`` characters.

    Raises:
        TypeError: ``prompt`` is not a str; ``rng`` is none of None, an int >= 0 or a
            ``numpy.random.Generator``.
        ValueError: ``length`` not an int >= 0, ``temperature`` not a finite number > 0,
            ``top_k`` not an int >= 1, an empty ``prompt`` (nothing to continue) or one with a
            character outside the corpus.
        FloatingPointError: the model's logits are not finite (its weights hold NaN or inf, as
            after a run that diverged): there is no distribution to sample from."""
    if not isinstance(prompt, str):
        raise TypeError(f"generate: prompt must be a str (the text to continue), got "
                        f"{type(prompt).__name__} {prompt!r:.40}")
    if not prompt:
        raise ValueError("generate: the prompt is empty; give at least one character to "
                         "continue (the command line's default is 'def ')")
    rng = _sampling_rng(rng)
    ids = np.array([corpus.encode(prompt)], np.int64)
    was_training = model.training
    model.eval()
    try:
        ids = sample(model, ids, length, temperature, top_k, rng)
    finally:
        model.train(was_training)
    return corpus.decode(ids[0].tolist())


def _val_loss(evaluator, corpus, batches: int, batch_size: int, block_size: int,
              seed: int) -> float:
    rng = np.random.default_rng(seed + 1)
    losses = [float(evaluator(*(tensor(a) for a in corpus.batch("val", batch_size, block_size,
                                                                 rng))))
              for _ in range(batches)]
    return float(np.mean(losses))


def train_gpt(*, epochs=None, steps_per_epoch=None, batch_size=None, block_size=None,
              n_layer=None, n_head=None, n_embd=None, dropout=None, lr=None, weight_decay=None,
              lr_schedule=None, eval_batches=None, clip_norm=None, accumulate: int = 1,
              amp: str | None = None, seed: int = 0, checkpoint=None, resume: bool = False,
              checkpoint_every: int = 100, sample: int = 0, temperature: float = 1.0,
              top_k: int | None = None, prompt: str = "def ", progress: bool = True,
              ddp: bool = False, logdir=None, report=print) -> dict:
    """Train the GPT (arguments left None take :data:`GPT_DEFAULTS`); ``report(line)`` gets
    the per-epoch lines.

    Args:
        amp: None (float32), ``"fp16"`` (with a dynamic ``GradScaler``) or ``"bf16"``.
        accumulate: micro-batches per update (``batch_size`` must be a multiple of it).
        checkpoint, resume, checkpoint_every: as ``miniflow.experiments.train.train_digits``.
        sample, temperature, top_k, prompt: characters generated at the end (0: none).
        ddp: data parallel over the process world (the module docstring; a world of one
            without an MPI launcher); ``batch_size`` is per rank.
        logdir: TensorBoard scalars (``miniflow.logging.TrainingLog``, rank 0) in the run
            ``<logdir>/<run_name(config)>``: per update the loss (the mean of the micro-batches'),
            lr, gradient norm, loss scale and skipped steps, per epoch the validation loss; a
            resumed run continues its run. Under AMP the model-update cast is then not fused
            (the same bits; the log reads the unscaled gradients).

    Ctrl-C (SIGINT, in the main thread) or SIGTERM as ``train_digits``: the update running ends, a
    checkpoint is saved there (with ``checkpoint``) and :class:`TrainingInterrupted` is raised.

    Returns:
        dict: ``val_losses`` (per epoch), ``unigram`` (the baseline, nats per character),
        ``losses`` (per update), ``sample`` (str or None), ``sample_error`` (why no sample
        was drawn from a model whose weights diverged to NaN or inf, else None), ``steps``,
        ``resumed_from``, ``checkpoint``, ``seconds``, ``model``, ``corpus``, ``config``, ``rank``,
        ``world_size`` and ``logdir`` (the TensorBoard run's folder, or None); on ranks other
        than 0 ``val_losses`` is empty and ``sample`` None.

    Raises:
        ValueError: an unknown ``amp``, a batch that does not split into ``accumulate``, or a
            ``block_size`` longer than a split of the text.
        ResumeError: as ``train_digits`` (another world size included).
        TrainingInterrupted: Ctrl-C or SIGTERM (naming the step and the last checkpoint).
        miniflow.MissingExtraError: ``logdir`` without the tensorboard extra.
    """
    given = dict(epochs=epochs, steps_per_epoch=steps_per_epoch, batch_size=batch_size,
                 block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
                 dropout=dropout, lr=lr, weight_decay=weight_decay, lr_schedule=lr_schedule,
                 eval_batches=eval_batches)
    c, config = _settings(given, seed, clip_norm, accumulate, amp)
    amp = config["amp"]
    t0 = time.perf_counter()
    manual_seed(seed)
    corpus = stdlib_text()
    _check_block(c["block_size"], corpus)           # before the model is made
    model, opt, graph, scaler = _gpt_training(corpus, c, clip_norm, amp, accumulate,
                                              logged=logdir is not None)
    rank, world = _data_parallel(graph, config) if ddp else (0, 1)
    total = c["epochs"] * c["steps_per_epoch"]
    sched = make_lr_schedule(opt, c["lr_schedule"], total)
    run, losses = {"step": 0, "val_losses": []}, []
    folder = None if checkpoint is None else _run_folder(checkpoint, resume, lock=rank == 0)
    path = None if folder is None else folder.path
    log = None
    try:
        if resume:
            run, losses = _resume(folder, config, model=model, optimizer=opt,
                                  grad_scaler=scaler, scheduler=sched, rng=RngState())
            run["val_losses"] = list(run["val_losses"])
        if folder is not None and rank == 0:
            folder.start_log(losses)            # the checkpoint's steps, none after them
        resumed_from = run["step"] if resume else None
        if logdir is not None and rank == 0:
            log = _open_log(logdir, graph, run, config, resumed_from)
        saver = _Saver(folder, rank, run, losses, resumed_from, log,
                       lambda: _checkpoint(config, run, model, opt, scaler, sched))
        _train_loop(graph, model, corpus, c, run, losses, sched, total, seed, report,
                    progress and rank == 0, saver.save if path is not None else None,
                    checkpoint_every, rank, world, log, saver.interrupted)
    finally:
        if folder is not None:
            folder.close()
        if log is not None:
            log.close()
    text = sample_error = None
    if sample and rank == 0:
        try:
            text = generate(model, corpus, prompt, sample, temperature, top_k)
        except FloatingPointError as e:     # a diverged run: its results are still returned
            sample_error = str(e)
    return {"val_losses": run["val_losses"], "unigram": corpus.unigram_loss(), "losses": losses,
            "sample": text, "sample_error": sample_error, "steps": run["step"],
            "resumed_from": resumed_from, "checkpoint": path,
            "seconds": time.perf_counter() - t0, "model": model,
            "corpus": corpus, "config": config, "scaler": scaler, "rank": rank,
            "world_size": world, "logdir": None if log is None else log.path,
            "parameters": sum(int(np.prod(p.shape)) for p in model.parameters())}


def _settings(given: dict, seed: int, clip_norm, accumulate: int, amp) -> tuple:
    """``(c, config)``: the recipe (:data:`GPT_DEFAULTS` where ``given`` has None) and the
    settings a checkpoint records.

    Raises:
        ValueError: an unknown ``amp``; a size or count that is not a positive integer (0
            epochs or steps would sample from an untrained model); a batch that does not split
            into ``accumulate``.
    """
    c = {k: GPT_DEFAULTS[k] if v is None else v for k, v in given.items()}
    for name in ("epochs", "steps_per_epoch", "batch_size", "block_size", "n_layer", "n_head",
                 "n_embd", "eval_batches"):
        positive_integer("train_gpt", name, c[name])
    positive_integer("train_gpt", "accumulate", accumulate)
    if c["batch_size"] % accumulate:
        raise ValueError(f"train_gpt: batch_size {c['batch_size']} is not a multiple of "
                         f"accumulate {accumulate}")
    return c, {**c, "model": "gpt", "seed": seed, "clip_norm": clip_norm,
               "accumulate": accumulate, "amp": amp_mode(amp, "train_gpt")}


def _check_block(block_size: int, corpus) -> None:
    """Raises ValueError where a window of ``block_size`` (and its next character) does not
    fit in a split of ``corpus``."""
    if block_size + 1 > min(len(corpus.train), len(corpus.val)):
        raise ValueError(f"train_gpt: block_size {block_size} is longer than the text: the "
                         f"validation split has {len(corpus.val)} characters, the training "
                         f"split {len(corpus.train)}; give a smaller --block-size")


def _open_log(logdir, graph, run: dict, config: dict, resumed_from):
    """The TensorBoard log of the run: a resumed run continues the run its checkpoint names."""
    from ..logging import TrainingLog
    name = run.get("tensorboard_run") if resumed_from is not None else None
    log = TrainingLog(logdir, graph, name or run_name(config), resume_step=resumed_from)
    run["tensorboard_run"] = os.path.basename(log.path)
    return log


class _Saver:
    """The checkpoints of a run in ``folder``: :meth:`save` writes the state ``state()`` (rank
    0; under ddp every rank holds the same state) after the losses, and remembers the step;
    :meth:`interrupted` is the exception of a Ctrl-C."""

    def __init__(self, folder, rank: int, run: dict, losses: list, saved_at, log, state):
        self.folder, self.rank, self.run, self.losses = folder, rank, run, losses
        self.saved_at, self.log, self.state = saved_at, log, state

    def save(self) -> None:
        if self.rank == 0:
            self.folder.append_losses(self.losses, self.saved_at or 0)   # the log covers it
            save(self.state(), self.folder.path)
            if self.log is not None:
                self.log.flush()
        self.saved_at = self.run["step"]

    def interrupted(self, save_now: bool) -> TrainingInterrupted:
        """``save_now``: between two updates, the state whole: checkpointed first."""
        path = None if self.folder is None else self.folder.path
        if save_now:
            return _interrupted(self.run["step"], path, self.saved_at, self.save)
        return TrainingInterrupted(self.run["step"], path, self.saved_at, saved_now=False)


def _checkpoint(config: dict, run: dict, model, opt, scaler, sched) -> dict:
    """What a GPT checkpoint holds: the settings, the run record, the model, optimizer, grad
    scaler and scheduler state and the random state (dropout's stream included)."""
    return {"config": config, "run": run, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "grad_scaler": scaler and scaler.state_dict(),
            "scheduler": sched and sched.state_dict(), "rng": RngState().state_dict()}


def _gpt_training(corpus, c: dict, clip_norm, amp: str | None, accumulate: int,
                  logged: bool) -> tuple:
    """``(model, optimizer, graph, scaler)`` of a GPT run with the settings ``c``
    (:data:`GPT_DEFAULTS` filled in): AdamW (nanoGPT's betas 0.9, 0.99), AMP in ``amp``'s dtype
    (a dynamic ``GradScaler`` for fp16, else None) and ``accumulate`` micro-batches; ``logged``
    (a TensorBoard log reads the unscaled gradients): the AMP model-update cast not fused."""
    model = models.gpt(corpus.vocab_size, c["block_size"], c["n_layer"], c["n_head"],
                       c["n_embd"], c["dropout"])
    opt = optim.AdamW(model.parameters(), lr=c["lr"], weight_decay=c["weight_decay"],
                      betas=(0.9, 0.99), clip_grad_max_norm=clip_norm)
    graph = TrainGPT(model, opt)
    scaler = GradScaler() if amp == "fp16" else None
    if amp is not None:
        graph.config.enable_amp(True, AMP_DTYPES[amp])
        if scaler is not None:
            graph.set_grad_scaler(scaler)
        if logged:
            graph.config.enable_fused_model_update_cast(False)
    if accumulate > 1:
        graph.config.set_gradient_accumulation_steps(accumulate)
    return model, opt, graph, scaler


def _data_parallel(graph: TrainGPT, config: dict) -> tuple:
    """Make ``graph`` data parallel over the process world (``distributed.init()``: a world of
    one without an MPI launcher) and record its size in the checkpoint ``config`` (another world
    trains on other windows); ``(rank, world_size)``."""
    distributed.init()
    graph.config.enable_data_parallel()
    config["world_size"] = distributed.world_size()
    return distributed.rank(), config["world_size"]


def _train_loop(graph, model, corpus, c, run, losses, sched, total, seed, report, progress,
                save_state, checkpoint_every, rank: int, world: int, log, interrupted) -> None:
    """The updates from ``run["step"]`` to ``total``: a validation loss every epoch (reported;
    rank 0 only), ``save_state()`` every ``checkpoint_every`` updates and at the end (None: no
    checkpoint); rank ``rank`` of ``world`` trains on its rows of each step's windows; ``log``
    (a ``TrainingLog`` or None) gets every update and epoch. A Ctrl-C stops between two updates
    and raises ``interrupted(True)`` (which checkpoints first); a second one stops at once
    (``interrupted(False)``)."""
    evaluator = EvalGPT(model)
    unigram = corpus.unigram_loss()
    bs, bl = c["batch_size"], c["block_size"]
    from tqdm import tqdm
    with tqdm(total=total, initial=run["step"], desc="train gpt", unit="step",
              disable=not progress) as bar, interrupt_signals(defer=True) as sigint:
        try:
            while run["step"] < total:
                if sigint.requested:
                    raise interrupted(True)
                _update(graph, corpus, bs, bl, rank, world, losses, log, sched)
                run["step"] += 1
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                if run["step"] % c["steps_per_epoch"] == 0 and rank == 0:
                    model.eval()
                    try:
                        run["val_losses"].append(_val_loss(   # the whole step's windows
                            evaluator, corpus, c["eval_batches"], bs * world, bl, seed))
                    finally:
                        model.train()
                    if log is not None:
                        log.epoch(validation_loss=run["val_losses"][-1])
                if save_state is not None and (run["step"] % checkpoint_every == 0
                                               or run["step"] == total):
                    save_state()
                if run["step"] % c["steps_per_epoch"] == 0 and rank == 0:
                    val = run["val_losses"][-1]
                    report(f"epoch {run['step'] // c['steps_per_epoch']}: validation loss "
                           f"{val:.4f} nats/char ({val / unigram:.2f} of the unigram model's "
                           f"{unigram:.4f})")
        except TrainingInterrupted:
            raise
        except KeyboardInterrupt:      # a second Ctrl-C: stop at once, no checkpoint now
            raise interrupted(False) from None


def _update(graph, corpus, bs: int, bl: int, rank: int, world: int, losses: list, log,
            sched) -> None:
    """One update on this rank's rows of the step's windows: its loss recorded (the mean of the
    micro-batch losses with accumulation; of more than one rank, the mean of the ranks' losses:
    the loss of the step's whole batch, as one process training on it records), logged, the
    schedule stepped."""
    x, y = corpus.batch("train", bs * world, bl)
    loss = graph(tensor(x[rank * bs:(rank + 1) * bs]), tensor(y[rank * bs:(rank + 1) * bs]))
    value = float(np.mean(loss.numpy()))
    if world > 1:
        value = float(np.mean(distributed.all_gather_object(value, "the step's loss")))
    losses.append(value)
    if log is not None:
        log.step(value if world > 1 else loss)
    if sched is not None:
        sched.step()


def run_name(config: dict) -> str:
    """The TensorBoard run name of a GPT configuration: precision, lr and schedule, batch,
    context, the settings that differ from :data:`GPT_DEFAULTS`, seed
    (``gpt-fp32-lr0.003-warmup-cosine-bs32-ctx64-seed0``; ``train.named_run``)."""
    return named_run(["gpt", config["amp"] or "fp32", f"lr{config['lr']:g}",
                      config["lr_schedule"], f"bs{config['batch_size']}",
                      f"ctx{config['block_size']}"], config, GPT_DEFAULTS,
                     (("n_layer", "L"), ("n_head", "H"), ("n_embd", "E"), ("epochs", "ep"),
                      ("steps_per_epoch", "spe"), ("weight_decay", "wd"), ("dropout", "drop")))
