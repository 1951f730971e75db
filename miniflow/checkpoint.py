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

__all__ = ["restore"]


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
    if not isinstance(checkpoint, dict):
        raise TypeError(f"restore: expected a checkpoint dict (miniflow.load's result), got "
                        f"{type(checkpoint).__name__}")
    assigns = []
    for name, obj in objects.items():
        if obj is None:
            continue
        prepare = getattr(obj, "prepare_load_state_dict", None)
        if prepare is None:
            raise TypeError(f"restore: {name}={type(obj).__name__} has no "
                            "prepare_load_state_dict; it cannot be restored")
        if name not in checkpoint:
            raise KeyError(f"restore: the checkpoint has no {name!r} (it has "
                           f"{sorted(map(str, checkpoint))})")
        try:
            assigns.append(prepare(checkpoint[name]))
        except (KeyError, TypeError, ValueError) as e:
            message = e.args[0] if e.args else type(e).__name__
            raise type(e)(f"checkpoint[{name!r}]: {message}") from None
    for assign in assigns:  # every state fits: assign them all
        assign()
