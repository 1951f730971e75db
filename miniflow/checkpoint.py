"""Restoring a training run from a checkpoint: :func:`restore` checks every part before it
assigns any, so a checkpoint that does not fit (another model, an edited value) changes
nothing, and names the part and the key that is wrong.

A training checkpoint is a dict of state dicts (written and read by :func:`miniflow.save` /
:func:`miniflow.load`), e.g. ``{"model": model.state_dict(), "optimizer": opt.state_dict(),
"grad_scaler": scaler.state_dict(), "scheduler": sched.state_dict(), "rng":
miniflow.random.RngState().state_dict(), "step": 100}``. Each object restored has
``prepare_load_state_dict(state)``, which checks ``state`` as its ``load_state_dict`` does and
returns the function that assigns it: modules, optimizers, grad scalers, LR schedulers,
:class:`miniflow.random.RngState`. Each load is all or nothing on its own already; :func:`restore`
makes the whole resume so.
"""
from __future__ import annotations

__all__ = ["restore", "restore_as"]


def restore(checkpoint: dict, **objects) -> None:
    """Load ``checkpoint[name]`` into each ``objects[name]`` (None objects are skipped), all or
    nothing: every state is checked before any object changes.

    Raises:
        TypeError: ``checkpoint`` is not a dict, or an object cannot be restored (no
            ``prepare_load_state_dict``).
        KeyError: the checkpoint has no entry for an object (listing what it has), or a state
            has missing or unknown keys.
        ValueError/TypeError: a state does not fit its object; the message starts with
            ``checkpoint['<name>']:`` and names the key.
    """
    restore_as(checkpoint, objects, "restore", "checkpoint")


def restore_as(checkpoint: dict, objects: dict, owner: str, what: str) -> None:
    """:func:`restore` for a caller named ``owner`` (``"G.load_state_dict"``) whose dict is a
    ``what`` (``"state_dict"``): its errors name both (``G.load_state_dict: state_dict['model']:
    ...``; :func:`restore`'s own messages keep their form).

    Raises:
        as :func:`restore`.
    """
    if not isinstance(checkpoint, dict):
        raise TypeError(f"{owner}: expected a {what} dict (miniflow.load's result), got "
                        f"{type(checkpoint).__name__}")
    prefix = "" if owner == "restore" else f"{owner}: "
    assigns = []
    for name, obj in objects.items():
        if obj is None:
            continue
        prepare = getattr(obj, "prepare_load_state_dict", None)
        if prepare is None:
            raise TypeError(f"{owner}: {name}={type(obj).__name__} has no "
                            "prepare_load_state_dict; it cannot be restored")
        if name not in checkpoint:
            raise KeyError(f"{owner}: the {what} has no {name!r} (it has "
                           f"{sorted(map(str, checkpoint))})")
        try:
            assigns.append(prepare(checkpoint[name]))
        except (KeyError, TypeError, ValueError) as e:
            message = e.args[0] if e.args else type(e).__name__
            raise type(e)(f"{prefix}{what}[{name!r}]: {message}") from None
    for assign in assigns:  # every state fits: assign them all
        assign()
