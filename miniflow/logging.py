"""TensorBoard scalars of training runs (the ``tensorboard`` extra: ``pip install -e
".[tensorboard]"``), written with tensorboardX: one event file per run, flushed per epoch.

Two lines in a training script (PyTorch's ``torch.utils.tensorboard`` habit)::

    log = TrainingLog("runs", graph)      # runs/<graph class>, a new folder
    ...
    loss = graph(x, y); log.step(loss)     # after every training call

:meth:`TrainingLog.step` reads the rest from the graph: the learning rate of each optimizer,
the loss scale and the number of skipped steps of its grad scaler, and the L2 norm of the
unscaled gradients of the plan that just ran; :meth:`TrainingLog.epoch` logs per-epoch values
(accuracy). ``tensorboard --logdir runs`` then shows every run of the folder side by side.

Tags: ``train/loss`` (the call's loss, the mean of the micro-batch losses with accumulation),
``train/lr`` (``train/lr/<k>`` for optimizer ``k`` > 0), ``train/grad_norm``,
``amp/loss_scale`` (the scale the step multiplied the loss by; the scaler's scale when the
log was made, then after each step), ``amp/skipped_steps`` (skipped so far, this step
included), ``eval/<name>`` per epoch. The x axis is the step, 1-based (an epoch's values at
the step it ended on). :class:`ScalarWriter` is the plain writer underneath (the stability
study logs its own metrics with it).
"""
from __future__ import annotations

import atexit
import os
import time

import numpy as np

from .dtype import is_bfloat16
from .extras import require
from .passes.fuse_model_update_cast import FusedUpdateState
from .passes.optimizer import CLIP_COEF
from .runtime.backend import get_backend

__all__ = ["ScalarWriter", "TrainingLog", "run_dir", "grad_norm", "unscaled_gradients"]


def run_dir(logdir, name: str, *, resume: bool = False) -> str:
    """The folder of run ``name`` in ``logdir``: ``logdir/name``, or ``name-2``, ``name-3`` ...
    when that is taken, so a new run never mixes its events with an older run's; with ``resume``
    ``logdir/name`` itself (the run continues)."""
    base = os.path.join(os.fspath(logdir), name)
    path, k = base, 1
    while not resume and os.path.exists(path):
        k += 1
        path = f"{base}-{k}"
    return path


class ScalarWriter:
    """One TensorBoard run: one event file in folder ``path`` (created), as PyTorch's
    ``SummaryWriter``: events are written as they are logged, :meth:`flush` puts them on disk,
    :meth:`close` ends the file. The events are tensorboardX's, written in the caller's thread
    by its ``EventsWriter`` (its ``SummaryWriter``'s writer thread left the events it had not
    taken from its queue out of a flush).

    ``purge_step``: a resumed run's first new step; TensorBoard drops the folder's events at or
    after it (tensorboardX's ``purge_step``). Closed at exit if not before.

    Raises:
        miniflow.extras.MissingExtraError: tensorboardX is not installed.
    """

    def __init__(self, path, *, purge_step: int | None = None):
        require("tensorboardX", "tensorboard", "miniflow.logging")
        self._events = require("tensorboardX.event_file_writer", "tensorboard",
                               "miniflow.logging")
        self._proto = require("tensorboardX.proto.event_pb2", "tensorboard", "miniflow.logging")
        self._summary = require("tensorboardX.proto.summary_pb2", "tensorboard",
                                "miniflow.logging").Summary
        self.path = os.fspath(path)
        self._writer = None
        self._open(purge_step)

    def _open(self, purge_step: int | None) -> None:
        """Start a new event file in the run's folder (made if missing), with ``purge_step``'s
        events first. tensorboardX names event files by the second; two files of a run within
        one second (a quick resume, a log after :meth:`close`) would share a name: the
        nanoseconds keep them apart, in order."""
        os.makedirs(self.path, exist_ok=True)
        self._writer = self._events.EventsWriter(os.path.join(self.path, "events"),
                                                 f".{time.time_ns()}")
        if purge_step is not None:              # as tensorboardX's SummaryWriter writes them
            Event, SessionLog = self._proto.Event, self._proto.SessionLog
            self._writer.write_event(Event(step=purge_step, file_version="brain.Event:2"))
            self._writer.write_event(Event(step=purge_step,
                                           session_log=SessionLog(status=SessionLog.START)))
        atexit.register(self.close)

    def add(self, step: int, scalars: dict) -> None:
        """Log ``{tag: value}`` at global step ``step`` (None values are skipped; NaN and inf
        are logged as they are): one event of all the step's values (``add_scalar`` per value
        costs ten times as much). After :meth:`close` a new event file is opened in the run's
        folder, as tensorboardX's and PyTorch's ``SummaryWriter`` do.

        Raises:
            TypeError: a value is not a real number (naming its tag); nothing is logged.
        """
        values = [self._summary.Value(tag=tag, simple_value=_scalar(tag, value))
                  for tag, value in scalars.items() if value is not None]
        if self._writer is None:
            self._open(None)
        self._writer.write_event(self._proto.Event(wall_time=time.time(), step=int(step),
                                                   summary=self._summary(value=values)))

    def flush(self) -> None:
        """Put every event logged so far on disk (written and fsynced: a run killed after it
        keeps them); the next events go on in the same file."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file (again: nothing)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            atexit.unregister(self.close)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _scalar(tag: str, value) -> float:
    """``value`` as the float TensorBoard stores: a real number, or an array or Tensor of one.

    Raises:
        TypeError: anything else (a string, a vector, a complex number), naming ``tag``."""
    a = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    if a.size != 1 or (a.dtype.kind not in "biuf" and not is_bfloat16(a.dtype)):
        raise TypeError(f"miniflow.logging: {tag} must be a real number (or an array of one), "
                        f"got {value!r:.60}")
    return float(a.reshape(()))


def unscaled_gradients(graph) -> dict:
    """Host copies of the unscaled gradients (``grad:<variable>`` results) of the plan of
    ``graph`` that ran last, before gradient clipping (a clipped gradient divided by its
    group's ``clip_coef``, in float64): variable name -> array.

    Raises:
        RuntimeError: the graph has not run a training step yet.
        ValueError: the plan fused the model-update cast (``enable_fused_model_update_cast``,
            on by default under AMP), whose gradients are still scaled.
    """
    if not graph.plans or not next(reversed(graph.plans.values())).graph.grads:
        raise RuntimeError(f"{type(graph).__name__}: no training step has run yet (no plan "
                           "with gradients)")
    plan = next(reversed(graph.plans.values()))
    fused = plan.context.state.get(FusedUpdateState)
    if fused is not None and fused.half_copies:
        raise ValueError(f"{type(graph).__name__}: the fused model-update cast keeps only scaled "
                         "gradients; call graph.config.enable_fused_model_update_cast(False) to "
                         "read the unscaled ones (the same bits, a little slower), or log "
                         "without the gradient norm (grad_norm=False)")
    to_numpy = get_backend().to_numpy
    coefs = {v: to_numpy(plan.buffers[v]) for k, v in plan.graph.results.items()
             if k.startswith(CLIP_COEF)}
    clipped_by = {n.outputs[0]: coefs[n.inputs[1]] for n in plan.graph.nodes
                  if n.op.name == "scalar_mul_by_tensor" and n.inputs[1] in coefs}
    out = {}
    for n, v in plan.graph.grads.items():
        g = to_numpy(plan.buffers[v])
        coef = clipped_by.get(v)
        out[n] = g if coef is None else _unclipped(g, coef)
    return out


def _unclipped(g: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """A gradient clipped by ``clip_grad_norm``'s ``coef`` (> 0: min(max_norm / (norm + 1e-6),
    1); 0 when the norm was inf) as it was before, in float64 (exact up to one rounding)."""
    c = float(np.asarray(coef).reshape(-1)[0])
    return g.astype(np.float64) / c if c != 0 else np.full(g.shape, np.inf)


def grad_norm(unscaled: dict) -> float:
    """L2 norm of all unscaled gradients together (float64 sum of squares); NaN if non-finite:
    the total norm ``torch.nn.utils.clip_grad_norm_`` returns, before clipping."""
    return float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in unscaled.values())))


class TrainingLog(ScalarWriter):
    """TensorBoard scalars of the training run of nn.Graph ``graph`` (see the module docstring).

    Args:
        logdir: the folder of runs (``tensorboard --logdir``).
        graph: the training graph; its optimizers and grad scaler are read at every step.
        run: the run's name (default the graph's class name); a taken name gets ``-2``, ``-3``
            ... unless ``resume_step`` is given.
        grad_norm: log ``train/grad_norm`` (needs the unscaled gradients, see
            :func:`unscaled_gradients`).
        resume_step: the steps a resumed run has done: the run's own folder is reused and its
            events after that step are dropped (tensorboardX's ``purge_step``).

    Raises:
        miniflow.extras.MissingExtraError: tensorboardX is not installed.
        ValueError: ``grad_norm`` for a graph without an optimizer (no gradients), or under
            AMP with the fused model-update cast enabled (its gradients are scaled, see
            :func:`unscaled_gradients`), before the run folder is made; :meth:`step` refuses
            too if the fusion is switched on later.
    """

    def __init__(self, logdir, graph, run: str | None = None, *, grad_norm: bool = True,
                 resume_step: int | None = None):
        if grad_norm and not graph.optimizers:      # else each step: "no training step yet"
            raise ValueError(f"TrainingLog: {type(graph).__name__} has no optimizer, so it has "
                             "no gradients to take the norm of; give the training graph "
                             "(self.add_optimizer(opt), loss.backward() in build), or pass "
                             "grad_norm=False to log its loss alone")
        if grad_norm and graph.config.amp is not None and graph.config.fused_model_update_cast:
            raise ValueError(f"TrainingLog: grad_norm needs the unscaled gradients, and "
                             f"{type(graph).__name__}'s AMP fuses the model-update cast, which "
                             "keeps only scaled ones; call "
                             "graph.config.enable_fused_model_update_cast(False) before making "
                             "the log (the same bits, a little slower), or pass grad_norm=False")
        name = run or type(graph).__name__
        super().__init__(run_dir(logdir, name, resume=resume_step is not None),
                         purge_step=None if resume_step is None else resume_step + 1)
        self.graph, self.grad_norm = graph, grad_norm
        self.steps = resume_step or 0
        self._scale = None if graph.grad_scaler is None else graph.grad_scaler.scale

    def step(self, loss) -> dict:
        """Log the training step that returned ``loss`` (a Tensor or array; call it before an
        LR scheduler steps, so ``train/lr`` is the step's own); returns ``{tag: value}``.

        Raises:
            TypeError: ``loss`` is no number, array or Tensor of numbers (None: the loss the
                training graph returned is what it takes).
            ValueError: ``loss`` is empty; ``grad_norm`` and the graph's gradients are scaled
                (see :func:`unscaled_gradients`).
        """
        loss = loss.numpy() if hasattr(loss, "numpy") else np.asarray(loss)
        if loss.dtype.kind not in "biuf" and not is_bfloat16(loss.dtype):
            raise TypeError(f"TrainingLog.step: expected the loss the training graph returned "
                            f"(a Tensor or array of numbers), got {loss.dtype} {loss!r:.60}")
        if loss.size == 0:
            raise ValueError("TrainingLog.step: the loss is empty; pass the loss the training "
                             "graph returned")
        values = {"train/loss": float(np.mean(loss))}
        for k, opt in enumerate(self.graph.optimizers):
            values["train/lr" + (f"/{k}" if k else "")] = opt.param_groups[0]["lr"]
        if self.grad_norm:
            values["train/grad_norm"] = grad_norm(unscaled_gradients(self.graph))
        scaler = self.graph.grad_scaler
        if scaler is not None:
            values["amp/loss_scale"] = self._scale        # the scale this step multiplied by
            values["amp/skipped_steps"] = scaler.num_skipped_steps
            self._scale = scaler.scale
        self.steps += 1
        self.add(self.steps, values)
        return values

    def epoch(self, **scalars) -> dict:
        """Log ``eval/<name>`` for each of ``scalars`` (``test_accuracy=0.97``) at the step the
        epoch ended on, and flush; returns ``{tag: value}``."""
        values = {f"eval/{k}": v for k, v in scalars.items()}
        self.add(self.steps, values)
        self.flush()
        return values
