"""The graph IR: flat SSA of Values and Nodes, a verifier, a text printer and a Graphviz export.

A :class:`Graph` is an ordered list of :class:`Node` s. Every Node has an op type (a name in the op
registry, ``miniflow.ops``), input Values, output Values and attributes. Every Value has a name, a
shape and a dtype, and is defined once: as a graph input, a variable (persistent state such as a
parameter), a constant, or an output of exactly one Node. Update ops (``sgd_update``...) have no
outputs; they write their variable inputs in place and are kept by dead-code elimination.

Printed form (``str(graph)``): a header declaring the inputs, variables and constants, then one line
per node (JAX jaxpr / PyTorch FX style)::

    graph(
        %x: f32[64,64],  # input
        %model.0.weight: f32[128,64],  # variable
        %c21: i64[1],  # constant [0]
    ) {
      %1: f32[64,128] = matmul(%x, %model.0.weight) {transpose_a=False, transpose_b=True}
      ...

Sources: PyTorch FX ``torch/fx/graph.py`` (a readable program), JAX ``core.py`` (typed equations).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dtype import DType, as_dtype

__all__ = ["Value", "Node", "Graph", "VerifyError", "format_shape"]


class VerifyError(ValueError):
    """The IR is inconsistent. The message names the node and prints the nodes around it."""


def format_shape(shape) -> str:
    """``(64, 10)`` -> ``[64,10]``."""
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


class Value:
    """An SSA value: ``name``, ``shape`` (tuple of ints, ``()`` for a scalar) and ``dtype``.

    ``kind`` is ``"input"``, ``"variable"``, ``"constant"`` or ``"node"`` (a node output);
    ``producer`` is the Node that defines it (None for the others).
    """

    __slots__ = ("name", "shape", "dtype", "kind", "producer")

    def __init__(self, name: str, shape, dtype: DType, kind: str = "node", producer=None):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = as_dtype(dtype)
        self.kind = kind
        self.producer = producer

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def type_str(self) -> str:
        """``f32[64,10]``."""
        return self.dtype.short + format_shape(self.shape)

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type_str}"


@dataclass(eq=False)
class Node:
    """One op application: ``outputs = op(*inputs) {attrs}``.

    ``amp_color`` is set by the AMP pass (``"white"``, ``"black"``, ``"gray"``, ``"clear"``,
    ``"unlisted"`` or ``"cast"``) and used by :meth:`Graph.to_dot`; None without AMP.
    """

    op: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    amp_color: str | None = None

    def format(self) -> str:
        """The node as one line of text, e.g. ``%7: f32[64,10] = matmul(%3, %w) {transpose_b=True}``."""
        args = ", ".join("%" + v.name for v in self.inputs)
        attrs = ""
        if self.attrs:
            attrs = " {" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.attrs.items()) + "}"
        if self.outputs:
            lhs = ", ".join(f"%{v.name}: {v.type_str}" for v in self.outputs) + " = "
        else:
            lhs = ""
        return f"{lhs}{self.op}({args}){attrs}"

    def __repr__(self) -> str:
        return f"Node({self.format()})"


_DOT_COLORS = {"white": ("white", "black"), "black": ("black", "white"), "gray": ("gray70", "black"),
               "clear": ("lightblue", "black"), "unlisted": ("khaki", "black"),
               "cast": ("gold", "black"), None: ("lavender", "black")}
"""AMP color -> (fill, font) in :meth:`Graph.to_dot` (None: no AMP, or made after the AMP pass)."""


def _write_dot(text: str, path: str) -> None:
    """Write ``text`` to ``<path minus suffix>.dot``; render ``.png`` next to it if ``dot`` exists."""
    base = os.path.splitext(path)[0]
    with open(base + ".dot", "w") as f:
        f.write(text)
    if shutil.which("dot"):
        subprocess.run(["dot", "-Tpng", base + ".dot", "-o", base + ".png"], check=True)


def _fmt_attr(v: Any) -> str:
    if isinstance(v, DType):
        return v.short
    if isinstance(v, float):
        return repr(v) if v == v and abs(v) != float("inf") else str(v)
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return repr(v)


_CONSTANT_VALUES_SHOWN = 8
"""The printer shows the value of a constant with at most this many elements."""


def _fmt_data(data: np.ndarray) -> str:
    """A small array as nested lists, each element in its dtype's shortest form: ``[0]``, ``2.0``."""
    text = np.array2string(data, separator=", ", formatter={"all": str}, max_line_width=10 ** 9)
    return text.replace("\n", "")  # rows of a 2-D+ array: one line


class Graph:
    """An IR graph: ``inputs``, ``variables`` (name -> Value), ``constants`` and ordered ``nodes``.

    Bookkeeping that passes share:

    * ``outputs``: Values returned by the user's ``build``.
    * ``loss``: the Value ``backward()`` was called on (None for inference graphs).
    * ``initial_grad``: the Value the autograd pass seeded the backward pass with (``ones_like(loss)``
      or an identity of it); the loss-scale pass finds it here even after AMP inserted casts.
    * ``grads``: variable name -> gradient Value, filled by the autograd pass (the loss-scale pass
      replaces them by the unscaled float32 gradients).
    * ``scaled_initial_grad``, ``nonfinite_counts`` (i64[n], one count per name in
      ``nonfinite_names``): set by the loss-scale pass.
    * ``constant_data``: name -> NumPy array for ``kind == "constant"`` Values.
    * ``variable_data``: name -> backend array holding a variable's state (not owned by the IR).
    """

    def __init__(self):
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.variables: dict[str, Value] = {}
        self.constant_data: dict[str, np.ndarray] = {}
        self.variable_data: dict = {}
        self.outputs: list[Value] = []
        self.loss: Value | None = None
        self.initial_grad: Value | None = None
        self.grads: dict[str, Value] = {}
        self.scaled_initial_grad: Value | None = None
        self.nonfinite_counts: Value | None = None
        self.nonfinite_names: list = []
        self._counter = 0

    # ----------------------------------------------------------------- building
    def fresh_name(self) -> str:
        """A new unique numeric value name."""
        self._counter += 1
        return str(self._counter)

    def add_input(self, name: str, shape, dtype) -> Value:
        """Declare a graph input (a placeholder fed by the caller at every run)."""
        v = Value(name, shape, dtype, kind="input")
        self.inputs.append(v)
        return v

    def add_variable(self, name: str, shape, dtype, data=None) -> Value:
        """Declare persistent state (a parameter, optimizer state, loss scale); returns its Value.

        ``data`` is the backend array that holds the state (owned by a module, optimizer or
        scaler, shared by every plan of the graph). Declaring a name twice returns the first Value.
        """
        if name in self.variables:
            return self.variables[name]
        v = Value(name, shape, dtype, kind="variable")
        self.variables[name] = v
        self.variable_data[name] = data
        return v

    def add_constant(self, data: np.ndarray) -> Value:
        """Embed a NumPy array as a constant Value."""
        name = "c" + self.fresh_name()
        data = np.ascontiguousarray(data)
        v = Value(name, data.shape, as_dtype(data.dtype), kind="constant")
        self.constant_data[name] = data
        return v

    def emit(self, op: str, *inputs: Value, index: int | None = None, **attrs):
        """Append (or insert at ``index``) a node of type ``op``; returns its output Value(s).

        Shapes and dtypes of the outputs come from the op's inference function, which also
        validates the inputs (raising ValueError/TypeError that name the op at build time).
        Returns a single Value for one-output ops, a tuple for several, None for none.
        """
        from .ops import get_op

        opdef = get_op(op)
        attrs = opdef.normalize_attrs(list(inputs), attrs)
        metas = opdef.infer(list(inputs), attrs)
        node = Node(op, list(inputs), [], attrs)
        node.outputs = [Value(self.fresh_name(), s, d, producer=node) for s, d in metas]
        if index is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(index, node)
        if len(node.outputs) == 1:
            return node.outputs[0]
        return tuple(node.outputs) if node.outputs else None

    def replace_uses(self, old: Value, new: Value, nodes=None) -> None:
        """Make every node (or only ``nodes``) that reads ``old`` read ``new``; updates bookkeeping."""
        for n in (self.nodes if nodes is None else nodes):
            n.inputs = [new if v is old else v for v in n.inputs]
        if nodes is None:
            self.outputs = [new if v is old else v for v in self.outputs]
            for k, v in self.grads.items():
                if v is old:
                    self.grads[k] = new
            if self.initial_grad is old:
                self.initial_grad = new

    def consumers(self) -> dict:
        """Map id(Value) -> list of Nodes reading it."""
        out: dict = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(id(v), []).append(n)
        return out

    # ----------------------------------------------------------------- checking
    def verify(self) -> None:
        """Check SSA and types: every input defined before use, each Value defined once, and every
        node's output shapes/dtypes equal to what its op infers from its inputs.

        Raises:
            VerifyError: naming the faulty node and printing the nodes around it.
        """
        from .ops import get_op

        defined = {id(v) for v in self.inputs}
        defined.update(id(v) for v in self.variables.values())
        for i, n in enumerate(self.nodes):
            for v in n.inputs:
                if v.kind == "constant":
                    if v.name not in self.constant_data:
                        self._fail(i, f"constant %{v.name} has no data")
                elif id(v) not in defined:
                    self._fail(i, f"input %{v.name} is used before it is defined (or never defined)")
            try:
                metas = get_op(n.op).infer(n.inputs, n.attrs)
            except (ValueError, TypeError, KeyError) as e:
                self._fail(i, f"op inference failed: {e}")
            if len(metas) != len(n.outputs):
                self._fail(i, f"op infers {len(metas)} outputs, node has {len(n.outputs)}")
            for v, (shape, dtype) in zip(n.outputs, metas):
                if v.shape != tuple(shape) or v.dtype is not dtype:
                    self._fail(i, f"output %{v.name} is {v.type_str} but {n.op} infers "
                                  f"{dtype.short}{format_shape(shape)}")
                if id(v) in defined:
                    self._fail(i, f"%{v.name} is defined twice")
                defined.add(id(v))
        for v in self.outputs:
            if v.kind != "constant" and id(v) not in defined:
                raise VerifyError(f"graph output %{v.name} is never defined")

    def _fail(self, i: int, msg: str):
        lo, hi = max(0, i - 3), min(len(self.nodes), i + 4)
        ctx = "\n".join(("--> " if j == i else "    ") + self.nodes[j].format() for j in range(lo, hi))
        raise VerifyError(f"node {i} ({self.nodes[i].op}): {msg}\n{ctx}")

    # ----------------------------------------------------------------- printing
    def __str__(self) -> str:
        """The graph as text: a header declaring the inputs, variables and the constants the
        nodes use (with their value when it has at most ``_CONSTANT_VALUES_SHOWN`` elements), then
        one line per node, the returned values and the loss. Every ``%name`` is declared."""
        lines = ["graph("]
        for v in self.inputs:
            lines.append(f"    %{v.name}: {v.type_str},  # input")
        for v in self.variables.values():
            lines.append(f"    %{v.name}: {v.type_str},  # variable")
        for v in self._used_constants():
            data = self.constant_data.get(v.name)
            value = ("(no data)" if data is None else _fmt_data(data)
                     if data.size <= _CONSTANT_VALUES_SHOWN else f"({data.size} elements)")
            lines.append(f"    %{v.name}: {v.type_str},  # constant {value}")
        lines.append(") {")
        for n in self.nodes:
            lines.append("  " + n.format())
        outs = ", ".join("%" + v.name for v in self.outputs)
        lines.append(f"  return ({outs})")
        if self.loss is not None:
            lines.append(f"  # loss: %{self.loss.name}")
        lines.append("}")
        return "\n".join(lines)

    def _used_constants(self) -> list:
        """The constant Values that nodes read or the graph returns, in order of first use."""
        seen: dict = {}
        for v in [v for n in self.nodes for v in n.inputs] + list(self.outputs):
            if v.kind == "constant":
                seen.setdefault(v.name, v)
        return list(seen.values())

    def __repr__(self) -> str:
        return f"<miniflow.ir.Graph: {len(self.nodes)} nodes>"

    def to_dot(self, path: str | None = None) -> str:
        """The graph as Graphviz DOT: a box per node filled by its AMP color, an edge per read
        labelled with the value's type, ellipses for graph inputs, variables and constants.

        Colors (``node.amp_color``): white = white fill (float16), black = black fill, gray = gray,
        clear = light blue, unlisted = khaki, inserted cast = gold; lavender = no AMP color (AMP
        off, or a node made by a later pass: loss scaling, optimizer).

        Args:
            path: when given, the DOT text is written to ``<path minus suffix>.dot`` and, if
                Graphviz's ``dot`` program is on PATH, rendered to ``<path minus suffix>.png``.
        Returns:
            the DOT text.
        """
        made_by = {id(v): f"n{i}" for i, n in enumerate(self.nodes) for v in n.outputs}
        lines = ["digraph miniflow {", '  node [shape=box, style=filled, fontname="Helvetica"];']
        sources = {}
        for n in self.nodes:
            for v in n.inputs:
                if id(v) not in made_by and id(v) not in sources:
                    sources[id(v)] = f"v{len(sources)}"
                    lines.append(f'  {sources[id(v)]} [shape=ellipse, fillcolor=white, '
                                 f'label="%{v.name}\\n{v.kind}"];')
        for i, n in enumerate(self.nodes):
            fill, font = _DOT_COLORS[n.amp_color]
            outs = "\\n".join(f"%{v.name}: {v.type_str}" for v in n.outputs)
            lines.append(f'  n{i} [label="{n.op}\\n{outs}", fillcolor={fill}, fontcolor={font}];')
            for v in n.inputs:
                src = made_by.get(id(v)) or sources[id(v)]
                lines.append(f'  {src} -> n{i} [label="{v.type_str}"];')
        lines.append('  ret [shape=ellipse, label="return"];')
        for v in self.outputs:
            src = made_by.get(id(v)) or sources.get(id(v))
            if src is not None:
                lines.append(f'  {src} -> ret [label="{v.type_str}"];')
        lines.append("}")
        text = "\n".join(lines) + "\n"
        if path is not None:
            _write_dot(text, path)
        return text

    def count_ops(self) -> dict:
        """Op type -> number of nodes of that type."""
        out: dict = {}
        for n in self.nodes:
            out[n.op] = out.get(n.op, 0) + 1
        return out
