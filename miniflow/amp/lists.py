"""The AMP lists: which op types run in float16 (white), float32 (black), or follow their neighbours.

The lists are OneFlow's after PR 9126 "Fix loss scale precision" (``oneflow/core/job_rewriter/
auto_mixed_precision_lists.cpp``), restricted to the op types miniflow defines, gradient op types
included. Each op declares its list where it is defined (``OpDef.amp``, with ``OpDef.amp_note``
for a remark), and this module reads them from the registry, so the lists cannot disagree with the
ops:

* **white**: always float16 (products accumulated in float32 by the kernel): ``matmul``,
  ``amp_white_identity``.
* **black**: always float32; black spreads downstream through gray ops: ``amp_black_identity``.
* **gray**: float16 only between white ops (or a white op and a graph sink), float32 after black
  ops: the arithmetic, reductions, softmax and loss ops and their gradients.
* **clear**: layout/trivial ops that take the color of their white neighbours (``reshape``,
  ``transpose``, ``relu``, ``identity``, ``broadcast_like``, ``ones_like`` ...).

An op in no list (``amp=None``) must say why in its ``amp_note``: :data:`UNLISTED` collects them
(``sigmoid``, ``exp``, ``log``: not in OneFlow's lists; ``cast``, ``constant``, the update and
loss-scale ops, ``fused_elementwise``: made or run outside AMP's coloring). Unlisted op types never
run in float16 and stop white propagation, like an op outside OneFlow's lists.

``WHITE``, ``BLACK``, ``GRAY``, ``CLEAR`` (tuples of op type names, sorted) and ``UNLISTED`` (name
-> reason) are read from the registry when asked for, so ops registered later are included. Per
graph, :class:`AmpLists` copies these defaults and lets a user move op types between lists
(``nn.Graph.config.enable_amp(..., black_add=("tanh",))``).
"""
from __future__ import annotations

from ..ops import OP_REGISTRY
from ..ops.registry import AMP_CATEGORIES

__all__ = ["WHITE", "BLACK", "GRAY", "CLEAR", "UNLISTED", "CATEGORIES", "AmpLists", "defaults"]

CATEGORIES = AMP_CATEGORIES
"""The four lists, in OneFlow's order."""


def defaults(category: str) -> tuple:
    """The op types whose definition puts them in list ``category``, sorted."""
    _check_category(category)
    return tuple(sorted(name for name, op in OP_REGISTRY.items() if op.amp == category))


def __getattr__(name):
    """``WHITE`` ... ``CLEAR`` and ``UNLISTED``, read from the op registry now."""
    if name in ("WHITE", "BLACK", "GRAY", "CLEAR"):
        return defaults(name.lower())
    if name == "UNLISTED":
        return {n: op.amp_note for n, op in sorted(OP_REGISTRY.items()) if op.amp is None}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _names(op_types) -> tuple:
    """A single op type name or an iterable of names -> tuple of names."""
    return (op_types,) if isinstance(op_types, str) else tuple(op_types)


def _check_registered(op_types) -> None:
    unknown = [t for t in op_types if t not in OP_REGISTRY]
    if unknown:
        raise ValueError(f"AMP lists: unknown op type(s) {', '.join(map(repr, unknown))}; "
                         f"registered op types: {', '.join(sorted(OP_REGISTRY))}")


def _check_category(category: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"AMP lists: unknown list {category!r}; "
                         f"choose one of {', '.join(CATEGORIES)}")


class AmpLists:
    """The white/black/gray/clear lists one graph uses (a copy of the defaults unless given).

    Args:
        white, black, gray, clear: op type names; default (None) the ops' own lists
            (:func:`defaults`).

    Raises:
        ValueError: an unknown op type name (listing the registered ones), or an op type in two lists.
    """

    def __init__(self, white=None, black=None, gray=None, clear=None):
        given = {c: defaults(c) if ops is None else _names(ops)
                 for c, ops in zip(CATEGORIES, (white, black, gray, clear))}
        self._category: dict = {}
        for category, op_types in given.items():
            _check_registered(op_types)
            for t in op_types:
                if self._category.get(t, category) != category:
                    raise ValueError(f"AMP lists: op type {t!r} is in both the {self._category[t]} "
                                     f"and the {category} list; an op type belongs to one list")
                self._category[t] = category

    def category(self, op_type: str) -> str | None:
        """``"white"``, ``"black"``, ``"gray"``, ``"clear"``, or None for an unlisted op type."""
        return self._category.get(op_type)

    def add(self, category: str, op_types) -> "AmpLists":
        """Put ``op_types`` (a name or names) in list ``category``, taking them out of any other list.

        Returns self, so calls chain. Raises ValueError for an unknown list or op type name.
        """
        _check_category(category)
        op_types = _names(op_types)
        _check_registered(op_types)
        for t in op_types:
            self._category[t] = category
        return self

    def remove(self, category: str, op_types) -> "AmpLists":
        """Take ``op_types`` out of list ``category`` (they become unlisted); returns self.

        Raises:
            ValueError: an unknown list or op type name, or an op type that is not in that list.
        """
        _check_category(category)
        op_types = _names(op_types)
        _check_registered(op_types)
        for t in op_types:
            if self._category.get(t) != category:
                where = f"in the {self._category[t]} list" if t in self._category else "unlisted"
                raise ValueError(f"AMP lists: cannot remove {t!r} from the {category} list: "
                                 f"it is {where}")
            del self._category[t]
        return self

    def ops(self, category: str) -> tuple:
        """The op types in list ``category``, sorted."""
        _check_category(category)
        return tuple(sorted(t for t, c in self._category.items() if c == category))

    def copy(self) -> "AmpLists":
        """An independent copy."""
        return AmpLists(*(self.ops(c) for c in CATEGORIES))

    def with_changes(self, add: dict | None = None, remove: dict | None = None) -> "AmpLists":
        """A copy with ``remove`` (list -> op types) taken out, then ``add`` (list -> op types) in.

        Raises:
            ValueError: an op type added to two lists, an unknown list or op type name, or an op
                type removed from a list it is not in.
        """
        added: dict = {}
        for category, op_types in (add or {}).items():
            for t in _names(op_types):
                if added.setdefault(t, category) != category:
                    raise ValueError(f"AMP lists: op type {t!r} is added to both the {added[t]} and "
                                     f"the {category} list; add it to one")
        out = self.copy()
        for category, op_types in (remove or {}).items():
            out.remove(category, op_types)
        for category, op_types in (add or {}).items():
            out.add(category, op_types)
        return out

    def __eq__(self, other) -> bool:
        return isinstance(other, AmpLists) and self._category == other._category

    def __repr__(self) -> str:
        return "AmpLists(" + ", ".join(f"{c}={list(self.ops(c))}" for c in CATEGORIES) + ")"
