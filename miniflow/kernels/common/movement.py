"""The fill builders of every backend (``ones_like``, ``constant``), over the backend's
``fill_steps(out, value)`` (``out[...] = value``, rounded once to out's dtype, as NumPy's
``fill``). The copies (``reshape``, ``transpose``, ``broadcast_like``) move data with each
backend's own means and have their builders there."""
from __future__ import annotations

__all__ = ["builders"]


def builders(fill_steps) -> dict:
    """Op type -> builder of ``ones_like`` and ``constant``."""
    def ones_like(node, ins, outs):
        """``out[...] = 1`` (x is read for its shape only)."""
        return fill_steps(outs[0], 1.0)

    def constant(node, ins, outs):
        """``out[...] = attrs["value"]``, rounded once to out's dtype."""
        return fill_steps(outs[0], float(node.attrs["value"]))

    return {"ones_like": ones_like, "constant": constant}
