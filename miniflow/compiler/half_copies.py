"""The half weight copies of fused AMP updates: under AMP with fused updates (the
``fuse_model_update_cast`` pass) a parameter also owns one copy of its value per half dtype, which
the fused updates write and the next step's matmuls read (OneFlow's
``enable_fused_model_update_cast``: the model-update kernels write the half model copy).

A copy is stored on its parameter (``Parameter.half_copies``, dtype name -> :class:`_HalfCopy`),
so every plan and every graph that trains the parameter shares it; it records the parameter
``version`` it equals. ``Parameter.version`` counts the writes of the value that the copies did
not follow (loading a state dict, an update that wrote no copy); :class:`HalfCopies` refreshes a
copy whose version differs before the next step.
"""
from __future__ import annotations

from ..dtype import float32
from ..ir import Node, Value
from ..ops import get_op
from ..passes.fuse_model_update_cast import FusedUpdateState
from ..runtime.backend import get_backend

__all__ = ["HalfCopies", "half_copy", "rounded_copies"]


class _HalfCopy:
    """A half copy's array and the parameter ``version`` it equals (-1: never made)."""

    __slots__ = ("array", "version")

    def __init__(self, array):
        self.array, self.version = array, -1


def half_copy(p, dtype) -> _HalfCopy:
    """The copy of Parameter ``p`` in half ``dtype`` (a miniflow DType), made on first use (an
    uninitialised backend array of ``p``'s shape, stale until refreshed)."""
    copies = vars(p).setdefault("half_copies", {})   # (a Parameter pickled before it had one)
    if dtype.name not in copies:
        copies[dtype.name] = _HalfCopy(get_backend().empty(p.shape, dtype.np))
    return copies[dtype.name]


def rounded_copies(graph, ctx, params: dict) -> None:
    """Give the copy variables of ``graph`` (``FusedUpdateState.half_copies``), a graph that no
    plan runs (``nn.Graph.lower``), data of their own: each parameter rounded to its copy's dtype
    now, in fresh arrays, so that ``ir.evaluate`` and the ONNX export read values (the shared
    copies are uninitialised until a step refreshes them). ``params``: variable name ->
    Parameter."""
    backend = get_backend()
    fused = ctx.state.get(FusedUpdateState)
    for name, copy_name in (fused.half_copies if fused is not None else ()):
        rounded = backend.to_numpy(params[name]._data).astype(graph.variables[copy_name].dtype.np)
        graph.variable_data[copy_name] = backend.from_numpy(rounded)


class HalfCopies:
    """The half weight copies of one compiled graph (``FusedUpdateState.half_copies`` of the
    ``fuse_model_update_cast`` pass): binds each copy variable to its parameter's copy, makes a
    stale copy equal to the parameter rounded (:meth:`refresh`, before a step: one ``cast``
    kernel) and, after a step, records what the step wrote (:meth:`stepped`): the fused updates
    wrote parameters and copies together, the other updates only parameters.

    Args:
        graph: the compiled IR graph (its copy variables get their data here).
        ctx: its compile context (the ``FusedUpdateState``, and the settings' ``trainable`` and
            ``optimizers``: whether the graph updates parameters).
        params: variable name -> Parameter of the graph's modules.
        backend: the backend the plan runs on (the cast kernel).
    """

    def __init__(self, graph, ctx, params: dict, backend):
        self.fused, self.refreshes = [], []
        fused_names = set()
        cast = backend.builder_for(get_op("cast"))
        fused = ctx.state.get(FusedUpdateState)
        for name, copy_name in (fused.half_copies if fused is not None else ()):
            p, v = params[name], graph.variables[copy_name]
            entry = half_copy(p, v.dtype)
            graph.variable_data[copy_name] = entry.array
            node = Node(get_op("cast"), [Value(name, p.shape, float32, kind="variable")],
                        [Value(copy_name, p.shape, v.dtype, kind="variable")], {"dtype": v.dtype})
            self.refreshes.append((p, entry, cast(node, [p._data], [entry.array])))
            self.fused.append((p, entry))
            fused_names.add(name)
        settings = ctx.settings
        self.plain = ([params[n] for n in settings.trainable if n not in fused_names]
                      if settings.optimizers and graph.grads else [])

    def stale(self) -> None:
        """Mark every copy stale (the parameters were written behind the copies' backs)."""
        for _, entry, _ in self.refreshes:
            entry.version = -1

    def refresh(self) -> None:
        """Make every stale copy equal to its parameter rounded to the copy's dtype."""
        for p, entry, steps in self.refreshes:
            if entry.version != p.version:
                for fn, args in steps:
                    fn(*args)
                entry.version = p.version

    def stepped(self) -> None:
        """After a step: parameters written by plain updates are ahead of their copies; the
        fused ones wrote their copy of this dtype too (copies of other dtypes fall behind)."""
        for p in self.plain:
            p.written()
        for p, entry in self.fused:
            p.written()
            entry.version = p.version
