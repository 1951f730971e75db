"""The graph IR: flat SSA of Values and Nodes, a verifier, a text printer, a Graphviz export and a
reference interpreter.

A :class:`Graph` holds its ``inputs``, ``variables`` (persistent state such as parameters, name ->
Value, with ``variable_data``), ``constants`` (name -> Value, with ``constant_data``), an ordered
list of :class:`Node` s and one dict of named ``results``: the user's outputs (``"output0"``,
``"output1"`` ...), the ``"loss"``, the parameter gradients (``"grad:<variable>"``) and the
loss-scale stage's ``"nonfinite_counts"``. Every pass treats the results alike: dead-code
elimination keeps them, fusion makes them outputs of their fused node, :meth:`Graph.replace_uses`
updates them. State that only passes share lives in their compile context, not here
(``miniflow.passes.pipeline.CompileContext``); what a pass decides per node goes to
``Node.meta`` (the AMP pass's ``meta["amp_color"]``, as PyTorch FX's ``Node.meta``).

A Node holds its op's definition (``node.op``, an ``OpDef`` of ``miniflow.ops``), input and output
Values and attributes; this module only calls the OpDef's ``normalize_attrs``, ``infer``,
``reference``, ``written`` and ``name``, so it imports nothing from ``miniflow.ops``. Every Value
has a shape and a dtype and is defined once: as a graph input, a variable, a constant, or an output
of exactly one Node. Some nodes also write variable inputs in place (:attr:`Node.written`): update
ops (``sgd_update``...), which have no outputs, and a training-mode ``normalization`` (its moving
statistics); dead-code elimination keeps them.

New nodes go to the end of the graph, or where an insertion point says (PyTorch FX's
``graph.inserting_after(node)``): ``with graph.inserting_after(n): graph.emit(...)``.

Printed form (``str(graph)``): a header declaring the inputs, variables and constants, then one line
per node (JAX jaxpr / PyTorch FX style). Names are given at print time: node outputs are numbered
``%0, %1 ...`` in order of definition, constants ``%c0, %c1 ...`` in order of first use, inputs and
variables keep their names, so every printed name is declared::

    graph(
        %x: f32[64,64],  # input
        %model.0.weight: f32[128,64],  # variable
        %c0: i64[1],  # constant [0]
    ) {
      %0: f32[64,128] = matmul(%x, %model.0.weight) {transpose_a=False, transpose_b=True}
      ...
      return (%8)
      # results: loss=%8, grad:model.0.weight=%19
    }

:func:`evaluate` runs any graph through its ops' NumPy float64 references: a reference interpreter
to read, and the oracle of the kernel tests.

Micro-batches (gradient accumulation, ``miniflow.ops.accumulation``): a graph with ``unpack``,
``acc`` or ``pack`` nodes runs in ``n`` micro-batches. Which node runs when follows from the data
flow (:meth:`Graph.micro_batch_schedule`, OneFlow's time shapes): a node that reads a value of
one micro-batch (an ``unpack`` output, or the output of such a node) runs once per micro-batch,
and so do the boundary ops; the other nodes run once per call, before the micro-batches if the
micro-batch nodes need them, else after. The node list stays one list in program order; the plan
and :func:`evaluate` run it in that schedule.

Sources: PyTorch FX ``torch/fx/graph.py`` (a readable program, insertion points, ``Node.meta``),
JAX ``core.py`` and ``docs/autodidax.py`` (typed equations, names given when printing, an
evaluator that walks the equations).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dtype import DType, as_dtype, graph_dtype

__all__ = ["Value", "Node", "Graph", "VerifyError", "MicroBatchSchedule", "runs_per_micro_batch",
           "format_shape", "evaluate", "output_name", "grad_name"]


class VerifyError(ValueError):
    """The IR is inconsistent. The message names the node and prints the nodes around it."""


def format_shape(shape) -> str:
    """``(64, 10)`` -> ``[64,10]``."""
    return "[" + ",".join(str(int(s)) for s in shape) + "]"


def output_name(i: int) -> str:
    """The result name of the user's ``i``-th output: ``"output0"`` ..."""
    return f"output{i}"


def grad_name(variable: str) -> str:
    """The result name of the gradient of ``variable``: ``"grad:model.0.weight"``."""
    return f"grad:{variable}"


def _is_output(result: str) -> bool:
    """Whether result name ``result`` is a user output (``"output<i>"``)."""
    return result.startswith("output") and result[6:].isdigit()


def _printed_names(msg: str, values, names: dict) -> str:
    """``msg`` (an op's error, which names Values as ``%<Value.name>``) with each of ``values``
    named as the printer names it (``names``)."""
    tags = {v.name: names[v] for v in values if v in names and names[v] != v.name}
    if not tags:
        return msg
    longest_first = sorted(tags, key=len, reverse=True)
    pattern = "%(" + "|".join(re.escape(t) for t in longest_first) + r")(?!\w)"
    return re.sub(pattern, lambda m: "%" + tags[m.group(1)], msg)


class Value:
    """An SSA value: ``name``, ``shape`` (tuple of ints, ``()`` for a scalar) and ``dtype``.

    ``kind`` is ``"input"``, ``"variable"``, ``"constant"`` or ``"node"`` (a node output);
    ``producer`` is the Node that defines it (None for the others). ``name`` identifies inputs,
    variables and constants; for node outputs it is a unique tag used in error messages before a
    graph is printed (the printer numbers them afresh). Values hash by identity.
    """

    __slots__ = ("name", "shape", "dtype", "kind", "producer")

    def __init__(self, name: str, shape, dtype: DType, kind: str = "node", producer=None):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = graph_dtype(dtype)
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

    ``op`` is the op's definition (an ``OpDef``; ``op.name`` is the op type). ``meta`` holds what
    passes decide about the node, e.g. ``meta["amp_color"]``: ``"white"``, ``"black"``,
    ``"gray"``, ``"clear"``, ``"unlisted"`` or ``"cast"``, set by the AMP pass and drawn by
    :meth:`Graph.to_dot`.
    """

    op: Any
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def written(self) -> list:
        """The input Values this node writes in place (``op.written(attrs, n_inputs)``)."""
        return [self.inputs[k] for k in self.op.written(self.attrs, len(self.inputs))]

    def format(self, names: dict | None = None) -> str:
        """The node as one line of text: ``%7: f32[64,10] = matmul(%3, %w) {transpose_b=True}``.

        ``names``: Value -> printed name (:meth:`Graph.names`); a Value missing from it (defined
        nowhere in the graph) prints as ``%?<its name>``. Without ``names``, Values show their
        ``name``."""
        def name(v):
            return v.name if names is None else names.get(v, "?" + v.name)

        args = ", ".join("%" + name(v) for v in self.inputs)
        attrs = ""
        if self.attrs:
            attrs = " {" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in self.attrs.items()) + "}"
        if self.outputs:
            lhs = ", ".join(f"%{name(v)}: {v.type_str}" for v in self.outputs) + " = "
        else:
            lhs = ""
        return f"{lhs}{self.op.name}({args}){attrs}"

    def __repr__(self) -> str:
        return f"Node({self.format()})"


def runs_per_micro_batch(node) -> bool:
    """Whether ``node`` is a boundary op of the micro-batches (``op.micro_batch``) that runs once
    per micro-batch: one without the ``micro_batch`` attribute (a node that has it is the call of
    that one micro-batch, run once, as in the op's samples)."""
    return node.op.micro_batch is not None and "micro_batch" not in node.attrs


@dataclass(frozen=True)
class MicroBatchSchedule:
    """When each node of a graph runs (:meth:`Graph.micro_batch_schedule`).

    Attributes:
        count: the number of micro-batches (1 for a graph without micro-batch ops).
        before: indices of the nodes that run once, before the micro-batches (what they need that
            depends on no micro-batch: a cast of a weight, a constant), in program order.
        each: indices of the nodes that run once per micro-batch, in program order (every node
            of a graph without micro-batch ops).
        after: indices of the nodes that run once, after the last micro-batch (the mean of the
            accumulated gradients, the updates, the loss-scale schedule), in program order.
    """

    count: int
    before: tuple
    each: tuple
    after: tuple


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
    """An IR graph: ``inputs``, ``variables`` and ``constants`` (name -> Value), ordered ``nodes``
    and named ``results`` (see the module docstring).

    ``variable_data``: name -> backend array holding a variable's state (not owned by the IR);
    ``constant_data``: name -> NumPy array of each constant. ``outputs``, ``loss`` and ``grads`` are
    read-only views of ``results``; :meth:`set_outputs` writes the user outputs.
    """

    def __init__(self):
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.variables: dict[str, Value] = {}
        self.variable_data: dict = {}
        self.constants: dict[str, Value] = {}
        self.constant_data: dict[str, np.ndarray] = {}
        self.results: dict[str, Value] = {}
        self._counter = 0
        self._point = None  # None: append; ("after" | "before", node): see inserting_after

    # ----------------------------------------------------------------- results
    @property
    def outputs(self) -> list:
        """The user's outputs, ``results["output0"], results["output1"] ...``."""
        out = []
        while output_name(len(out)) in self.results:
            out.append(self.results[output_name(len(out))])
        return out

    @property
    def loss(self) -> Value | None:
        """``results["loss"]``: the Value ``backward()`` was called on (None for inference)."""
        return self.results.get("loss")

    @property
    def grads(self) -> dict:
        """Variable name -> gradient Value, from the ``"grad:<variable>"`` results."""
        prefix = grad_name("")
        return {k[len(prefix):]: v for k, v in self.results.items() if k.startswith(prefix)}

    def set_outputs(self, values) -> None:
        """Make ``values`` the user's outputs (``results["output0"]`` ...), replacing any before."""
        for k in [k for k in self.results if _is_output(k)]:
            del self.results[k]
        for i, v in enumerate(values):
            self.results[output_name(i)] = v

    # ----------------------------------------------------------------- building
    def fresh_name(self) -> str:
        """A new unique value tag."""
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
        """Embed a NumPy array as a constant Value (C-contiguous, of its own shape: a 0-d array
        stays 0-d, where ``np.ascontiguousarray`` would make it ``[1]``)."""
        name = "c" + self.fresh_name()
        data = np.asarray(data, order="C")
        v = Value(name, data.shape, as_dtype(data.dtype), kind="constant")
        self.constants[name] = v
        self.constant_data[name] = data
        return v

    def emit(self, op, *inputs: Value, **attrs):
        """Add a node of ``op`` (an ``OpDef``; by name: ``miniflow.ops.emitter(graph)``) at the
        insertion point (default: the end); returns its output Value(s).

        Shapes and dtypes of the outputs come from the op's inference function, which also
        validates the inputs (raising ValueError/TypeError that name the op at build time).
        Returns a single Value for one-output ops, a tuple for several, None for none.

        Raises:
            TypeError: ``op`` is a name, not an OpDef.
        """
        if isinstance(op, str):
            raise TypeError(f"Graph.emit takes an OpDef, got the name {op!r}: use "
                            f"miniflow.ops.get_op({op!r}), or emit = miniflow.ops.emitter(graph)")
        attrs = op.normalize_attrs(list(inputs), attrs)
        metas = op.infer(list(inputs), attrs)
        node = Node(op, list(inputs), [], attrs)
        node.outputs = [Value(self.fresh_name(), s, d, producer=node) for s, d in metas]
        self._insert(node)
        if len(node.outputs) == 1:
            return node.outputs[0]
        return tuple(node.outputs) if node.outputs else None

    def _insert(self, node: Node) -> None:
        if self._point is None:
            self.nodes.append(node)
            return
        where, anchor = self._point
        if where == "after":
            self.nodes.insert(self.nodes.index(anchor) + 1, node)
            self._point = ("after", node)   # the next emit goes after this one
        else:
            self.nodes.insert(self.nodes.index(anchor), node)

    @contextlib.contextmanager
    def inserting_after(self, node: Node):
        """Inside the block, :meth:`emit` puts new nodes right after ``node``, in emit order."""
        saved, self._point = self._point, ("after", node)
        try:
            yield
        finally:
            self._point = saved

    @contextlib.contextmanager
    def inserting_before(self, node: Node):
        """Inside the block, :meth:`emit` puts new nodes right before ``node``, in emit order."""
        saved, self._point = self._point, ("before", node)
        try:
            yield
        finally:
            self._point = saved

    def replace_uses(self, old: Value, new: Value, nodes=None) -> None:
        """Make every node (or only ``nodes``) that reads ``old`` read ``new``; without ``nodes``
        the results that are ``old`` become ``new`` too."""
        for n in (self.nodes if nodes is None else nodes):
            n.inputs = [new if v is old else v for v in n.inputs]
        if nodes is None:
            for k, v in self.results.items():
                if v is old:
                    self.results[k] = new

    def uses(self, value: Value) -> list:
        """The nodes that read ``value``, in graph order."""
        return [n for n in self.nodes if any(v is value for v in n.inputs)]

    def users(self) -> dict:
        """Value -> the nodes that read it, in graph order: :meth:`uses` for every value at once."""
        out: dict = {}
        for n in self.nodes:
            for v in dict.fromkeys(n.inputs):
                out.setdefault(v, []).append(n)
        return out

    # ----------------------------------------------------------------- checking
    def verify(self) -> None:
        """Check SSA and types: every input defined before use, each Value defined once, every
        node's output shapes/dtypes equal to what its op infers from its inputs, every written
        input a variable (state the plan binds, never a scratch value), and every result defined.

        Raises:
            VerifyError: naming the faulty node and printing the nodes around it.
        """
        names = self.names()
        defined = set(self.inputs) | set(self.variables.values())
        for i, n in enumerate(self.nodes):
            for v in n.inputs:
                if v.kind == "constant":
                    if v.name not in self.constant_data:
                        self._fail(i, f"constant %{names.get(v, v.name)} has no data", names)
                elif v in names:
                    if v not in defined:
                        self._fail(i, f"input %{names[v]} is used before it is defined", names)
                else:
                    self._fail(i, f"input %?{v.name} is defined nowhere in the graph (the output "
                                  f"of a removed node? rewire its readers first: "
                                  f"graph.replace_uses(old, new))", names)
            for v in n.written:
                if v.kind != "variable":
                    self._fail(i, f"writes %{names.get(v, v.name)} in place, which is a {v.kind}, "
                                  f"not a variable", names)
            try:
                metas = n.op.infer(n.inputs, n.attrs)
            except (ValueError, TypeError, KeyError) as e:
                msg = _printed_names(str(e.args[0]) if e.args else str(e), n.inputs, names)
                self._fail(i, f"op inference failed: {msg}", names)
            if len(metas) != len(n.outputs):
                self._fail(i, f"op infers {len(metas)} outputs, node has {len(n.outputs)}", names)
            for v, (shape, dtype) in zip(n.outputs, metas):
                if v.shape != tuple(shape) or v.dtype is not dtype:
                    self._fail(i, f"output %{names[v]} is {v.type_str} but {n.op.name} infers "
                                  f"{dtype.short}{format_shape(shape)}", names)
                if v in defined:
                    self._fail(i, f"%{names[v]} is defined twice", names)
                defined.add(v)
        for k, v in self.results.items():
            if v.kind != "constant" and v not in defined:
                raise VerifyError(f"result {k!r} (%{names.get(v, '?' + v.name)}) is never "
                                  f"defined")
        self.micro_batch_schedule()

    def micro_batch_schedule(self) -> MicroBatchSchedule:
        """Which nodes run before, during (once per micro-batch) and after the micro-batches (see
        the module docstring; the boundary ops are those whose ``op.micro_batch`` is set).

        Raises:
            VerifyError: the boundary ops disagree on the number of micro-batches; an ``unpack``
                of a per-micro-batch value; a node of the micro-batches that reads an
                ``acc``/``pack`` output (complete only after the last micro-batch); a node run
                before the micro-batches that reads a variable a micro-batch node writes earlier
                in the program; a user output that is one micro-batch's value (pack it).
        """
        names = self.names()
        per, each, counts = set(), [], set()
        collected = {}  # value -> index of the collecting node that makes it
        for i, n in enumerate(self.nodes):
            kind = n.op.micro_batch[0] if runs_per_micro_batch(n) else None
            if kind:
                counts.add(n.attrs[n.op.micro_batch[1]])
            reads_each = any(v in per for v in n.inputs)
            reads_collected = [v for v in n.inputs if v in collected]
            if kind == "split" and reads_each:
                self._fail(i, f"{n.op.name} reads a value of one micro-batch; it splits values "
                              "read once per call (graph inputs)", names)
            if (kind or reads_each) and reads_collected:
                v = reads_collected[0]
                self._fail(i, f"%{names[v]} is the output of "
                              f"{self.nodes[collected[v]].op.name}, complete only after the "
                              "last micro-batch: it cannot be read inside the micro-batches",
                           names)
            if kind or reads_each:
                each.append(i)
                if kind == "collect":
                    collected.update((v, i) for v in n.outputs)
                else:
                    per.update(n.outputs)
        if len(counts) > 1:
            raise VerifyError(f"the micro-batch ops disagree on the number of micro-batches: "
                              f"{sorted(counts)}")
        if not counts:
            return MicroBatchSchedule(1, (), tuple(range(len(self.nodes))), ())
        in_each, needed, before = set(each), set(), []
        for i in range(len(self.nodes) - 1, -1, -1):
            n = self.nodes[i]
            if i in in_each or any(v in needed for v in n.outputs):
                needed.update(n.inputs)
                if i not in in_each:
                    before.append(i)
        before.reverse()
        written = {}  # variable -> index of the first micro-batch node that writes it
        for i in each:
            for v in self.nodes[i].written:
                written.setdefault(v, i)
        for i in before:
            for v in self.nodes[i].inputs:
                if written.get(v, len(self.nodes)) < i:
                    self._fail(i, f"reads %{names[v]} after node {written[v]} writes it in "
                                  "every micro-batch, but would run before the micro-batches",
                               names)
        for k, v in self.results.items():
            if _is_output(k) and v in per:
                raise VerifyError(f"output {k!r} (%{names[v]}) is a value of one micro-batch; "
                                  "pack it (the pack op) to return all micro-batches")
        shown = set(before) | in_each
        return MicroBatchSchedule(counts.pop(), tuple(before), tuple(each),
                                  tuple(i for i in range(len(self.nodes)) if i not in shown))

    def _fail(self, i: int, msg: str, names: dict):
        lo, hi = max(0, i - 3), min(len(self.nodes), i + 4)
        ctx = "\n".join(("--> " if j == i else "    ") + self.nodes[j].format(names)
                        for j in range(lo, hi))
        raise VerifyError(f"node {i} ({self.nodes[i].op.name}): {msg}\n{ctx}")

    # ----------------------------------------------------------------- printing
    def names(self) -> dict:
        """Value -> its printed name: inputs and variables by name, constants ``c0, c1 ...`` in
        order of first use, node outputs ``0, 1 ...`` in order of definition."""
        out = {v: v.name for v in self.inputs}
        out.update((v, name) for name, v in self.variables.items())
        out.update((v, f"c{k}") for k, v in enumerate(self._used_constants()))
        k = 0
        for n in self.nodes:
            for v in n.outputs:
                out[v] = str(k)
                k += 1
        return out

    def __str__(self) -> str:
        """The graph as text: a header declaring the inputs, variables and the constants the
        nodes use (with their value when it has at most ``_CONSTANT_VALUES_SHOWN`` elements), then
        one line per node, the returned values (user outputs) and the other results. Every
        ``%name`` is declared."""
        names = self.names()
        lines = ["graph("]
        for v in self.inputs:
            lines.append(f"    %{v.name}: {v.type_str},  # input")
        for v in self.variables.values():
            lines.append(f"    %{v.name}: {v.type_str},  # variable")
        for v in self._used_constants():
            data = self.constant_data.get(v.name)
            value = ("(no data)" if data is None else _fmt_data(data)
                     if data.size <= _CONSTANT_VALUES_SHOWN else f"({data.size} elements)")
            lines.append(f"    %{names[v]}: {v.type_str},  # constant {value}")
        lines.append(") {")
        for n in self.nodes:
            lines.append("  " + n.format(names))
        outputs = self.outputs
        lines.append(f"  return ({', '.join('%' + names.get(v, v.name) for v in outputs)})")
        others = [f"{k}=%{names.get(v, v.name)}" for k, v in self.results.items()
                  if not _is_output(k)]
        if others:
            lines += textwrap.wrap(", ".join(others), width=100, initial_indent="  # results: ",
                                   subsequent_indent="  #   ", break_on_hyphens=False)
        lines.append("}")
        return "\n".join(lines)

    def _used_constants(self) -> list:
        """The constant Values that nodes read or the graph's results are, in order of first use."""
        seen: dict = {}
        for v in [v for n in self.nodes for v in n.inputs] + list(self.results.values()):
            if v.kind == "constant":
                seen.setdefault(v.name, v)
        return list(seen.values())

    def __repr__(self) -> str:
        return f"<miniflow.ir.Graph: {len(self.nodes)} nodes>"

    def _repr_html_(self) -> str:
        """The printed graph as HTML, nodes filled by their AMP color and casts and identities
        marked (``miniflow.ir_html``): how a Jupyter notebook shows a graph (``step.ir`` as the
        last line of a cell)."""
        from .ir_html import graph_html
        return graph_html(self)

    def to_dot(self, path: str | None = None) -> str:
        """The graph as Graphviz DOT: a box per node filled by its AMP color, an edge per read
        labelled with the value's type, ellipses for graph inputs, variables and constants.

        Colors (``node.meta["amp_color"]``): white = white fill (float16), black = black fill,
        gray = gray, clear = light blue, unlisted = khaki, inserted cast = gold; lavender = no AMP
        color (AMP off, or a node made by a later pass: loss scaling, optimizer). Values are named
        as the printer names them.

        Args:
            path: when given, the DOT text is written to ``<path minus suffix>.dot`` and, if
                Graphviz's ``dot`` program is on PATH, rendered to ``<path minus suffix>.png``.
        Returns:
            the DOT text.
        """
        names = self.names()
        made_by = {v: f"n{i}" for i, n in enumerate(self.nodes) for v in n.outputs}
        lines = ["digraph miniflow {", '  node [shape=box, style=filled, fontname="Helvetica"];']
        sources = {}
        for v in [v for n in self.nodes for v in n.inputs] + list(self.outputs):
            if v not in made_by and v not in sources:     # an output may be an input itself
                sources[v] = f"v{len(sources)}"
                lines.append(f'  {sources[v]} [shape=ellipse, fillcolor=white, '
                             f'label="%{names.get(v, v.name)}\\n{v.kind}"];')
        for i, n in enumerate(self.nodes):
            fill, font = _DOT_COLORS[n.meta.get("amp_color")]
            outs = "\\n".join(f"%{names[v]}: {v.type_str}" for v in n.outputs)
            lines.append(f'  n{i} [label="{n.op.name}\\n{outs}", fillcolor={fill}, '
                         f'fontcolor={font}];')
            for v in n.inputs:
                src = made_by.get(v) or sources[v]
                lines.append(f'  {src} -> n{i} [label="{v.type_str}"];')
        lines.append('  ret [shape=ellipse, label="return"];')
        for v in self.outputs:
            lines.append(f'  {made_by.get(v) or sources[v]} -> ret [label="{v.type_str}"];')
        lines.append("}")
        text = "\n".join(lines) + "\n"
        if path is not None:
            _write_dot(text, path)
        return text

    def count_ops(self) -> dict:
        """Op type name -> number of nodes of that type."""
        out: dict = {}
        for n in self.nodes:
            out[n.op.name] = out.get(n.op.name, 0) + 1
        return out


# --------------------------------------------------------------------- the reference interpreter
def _as64(a) -> np.ndarray:
    """A host copy of ``a`` (a NumPy or device array) in float64, or int64 for integers."""
    a = a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)
    return a.astype(np.int64 if a.dtype.kind in "iub" else np.float64)


def _checked(what: str, v: Value, data) -> np.ndarray:
    """``data`` as :func:`_as64` makes it, for ``v``; ValueError unless its shape is ``v``'s and
    its kind (integer or bool, floating) ``v``'s dtype's."""
    a = _as64(data)
    kind, want = ("integer" if k in "biu" else "floating"
                  for k in (np.asarray(data).dtype.kind if not hasattr(data, "copy_to_host")
                            else data.dtype.kind, v.dtype.np.kind))
    if a.shape != v.shape or kind != want:
        raise ValueError(f"evaluate: {what} is {v.type_str}, got a {kind} array of shape "
                         f"{format_shape(a.shape)}")
    return a


def _bound(graph: Graph, inputs, given: dict) -> dict:
    """:func:`evaluate`'s starting values: Value -> float64 (int64) array for every input and
    variable (``given``, else ``graph.variable_data``), each checked (:func:`_checked`)."""
    if len(inputs) != len(graph.inputs):
        raise ValueError(f"evaluate: the graph has {len(graph.inputs)} input(s), got {len(inputs)}")
    env = {v: _checked(f"input %{v.name}", v, a) for v, a in zip(graph.inputs, inputs)}
    unknown = sorted(set(given) - set(graph.variables))
    if unknown:
        raise ValueError(f"evaluate: variables= names no variable of the graph: {unknown} (its "
                         f"variables: {sorted(graph.variables)})")
    for name, v in graph.variables.items():
        data = given[name] if name in given else graph.variable_data.get(name)
        if data is None:
            raise ValueError(f"evaluate: variable %{name} has no value; pass variables={{{name!r}: "
                             f"array}}")
        env[v] = _checked(f"variable %{name}", v, data)
    return env


def evaluate(graph: Graph, inputs, variables: dict | None = None) -> dict:
    """Run ``graph`` through its ops' NumPy references in float64 (integers in int64): the reference
    interpreter (JAX's ``eval_jaxpr``). Each node's ``op.reference`` maps its input arrays to its
    output arrays, then the new values of the inputs it writes (:attr:`Node.written`), which
    later nodes then read. Only ``cast`` and ``constant`` round (to their dtype), and the ops
    with ``round_outputs`` (``cast_like``), whose outputs it rounds to their dtypes. A graph with
    micro-batches runs in its :meth:`Graph.micro_batch_schedule`.

    Args:
        inputs: one array per ``graph.inputs``, in order.
        variables: name -> array for some or all variables; the others are read from
            ``graph.variable_data`` (never written: the new values are returned).

    Returns:
        ``{result name: array}`` for every result, plus ``{variable name: new array}`` for every
        variable an update op wrote.

    Raises:
        ValueError: a wrong number of inputs, an input or variable of another shape or kind
            (integer or bool, floating) than the graph's, a ``variables`` name that is no variable,
            a variable without a value, a reference whose outputs differ in number or shape from
            the node's, or a written variable named like a result.
        NotImplementedError: an op without a reference, naming it.
    """
    env = _bound(graph, inputs, variables or {})
    constants = {name: _as64(a) for name, a in graph.constant_data.items()}
    var_name = {v: name for name, v in graph.variables.items()}
    written: dict = {}

    def read(v):
        return constants[v.name] if v.kind == "constant" else env[v]

    def run(i: int, micro_batch: int) -> None:
        node = graph.nodes[i]
        op = node.op
        if op.reference is None:
            raise NotImplementedError(f"evaluate: op {op.name!r} has no reference (node {i}: "
                                      f"{node.format()}); declare reference= in its OpDef")
        targets = node.outputs + node.written
        args, attrs = [read(v) for v in node.inputs], node.attrs
        if runs_per_micro_batch(node):  # a boundary op: the micro-batch, and the output so far
            attrs = {**attrs, "micro_batch": micro_batch}
            if op.micro_batch[0] == "collect" and micro_batch > 0:
                args += [env[v] for v in node.outputs]
        arrays = [_as64(a) for a in op.reference(args, attrs)]
        if op.round_outputs:
            arrays = [_as64(a.astype(v.dtype.np)) for a, v in zip(arrays, targets)]
        if len(arrays) != len(targets):
            raise ValueError(f"evaluate: the reference of {op.name} gave {len(arrays)} "
                             f"array(s) for {len(targets)} value(s)")
        for v, a in zip(targets, arrays):
            if a.shape != v.shape:
                raise ValueError(f"evaluate: the reference of {op.name} gave shape "
                                 f"{format_shape(a.shape)} for %{v.name} ({v.type_str})")
            env[v] = a
            if v in var_name:
                written[var_name[v]] = a

    schedule = graph.micro_batch_schedule()
    with np.errstate(all="ignore"):  # inf and NaN are values, as in the kernels
        for i in schedule.before:
            run(i, 0)
        for k in range(schedule.count):
            for i in schedule.each:
                run(i, k)
        for i in schedule.after:
            run(i, 0)
    out = {k: read(v) for k, v in graph.results.items()}
    clash = sorted(set(out) & set(written))
    if clash:
        raise ValueError(f"evaluate: written variable(s) {clash} are named like results")
    return {**out, **written}
