"""Plans: a compiled graph as a flat list of kernel calls over preallocated buffers.

Building a plan (once per input signature) allocates a buffer for every Value, binds variables to
the arrays that hold their state, and asks the backend's kernel builder of every node for its steps.
Running a plan copies the inputs in, runs ``fn(*args)`` for every step, and copies the outputs out:
no shape inference, no allocation per node, no dict lookups (docs/architecture.md, "Plan, not
interpreter"). Kernels are found once, when the plan is built (``Backend.builder_for``; the builder
contract is in ``miniflow.runtime.backend.Backend``). At its first run the backend turns the steps
into the calls it makes at every run (``Backend.prepare``: the steps themselves on the cpu; packed
launches or one CUDA graph on cuda), and the inputs and outputs go through the backend's input
stager and output copiers (pinned, asynchronous and pooled on cuda).

A graph with micro-batches (gradient accumulation) is still one flat list of steps: the steps of
the nodes that run before the micro-batches, then those of the micro-batch nodes once per
micro-batch, then the rest (``Graph.micro_batch_schedule``). The micro-batch nodes share their
buffers across the micro-batches; only the boundary ops (``unpack``, ``acc``, ``pack``) get steps
of their own per micro-batch (built with ``attrs["micro_batch"] = i``), the other nodes' steps are
built once and repeated.
"""
from __future__ import annotations

import dataclasses
import gc

import numpy as np

from ..ir import Graph, runs_per_micro_batch
from .notice import compile_notice

__all__ = ["Plan", "allocate", "build_steps", "check_owned", "constant_nodes", "fused_pairs",
           "grouped_nodes"]


def check_owned(backend, array, what: str):
    """``array`` if it lives in ``backend``'s memory (or is None).

    Raises:
        TypeError: it belongs to another backend (e.g. a model created before ``set_backend``),
            naming ``what`` and the fix.
    """
    if array is not None and not backend.owns(array):
        kind = f"{type(array).__module__}.{type(array).__name__}"
        raise TypeError(f"{what} holds a {kind}, not an array of the {backend.name!r} backend this "
                        f"runs on: it was created while another backend was selected. Call "
                        f"miniflow.set_backend({backend.name!r}) (or set MINIFLOW_BACKEND) before "
                        f"creating models, optimizers and tensors.")
    return array


def build_steps(nodes, buffers: dict, backend, micro_batch: int | None = None,
                fused: dict | None = None, groups: dict | None = None):
    """Kernel steps for ``nodes``; allocates the buffers of their outputs into ``buffers`` (those
    not there yet).

    ``micro_batch``: build the boundary ops of the micro-batches (``op.micro_batch``) for that
    micro-batch (``attrs["micro_batch"]``). ``fused``: ``node -> consumer``: build that node
    and its consumer as one (``Backend.fused_builder``), in the node's place; the consumer is
    not in ``nodes``. ``groups``: ``node -> member nodes``: build the members (the node
    last) as one (``Backend.group_builder``), in the node's place; the others are not in
    ``nodes``.

    Returns ``(steps, owners)``: the ``(fn, args)`` list and, per step, the index of its node.

    Raises:
        NotImplementedError: the backend has no kernel for an op type (names the op and backend).
    """
    steps, owners = [], []
    for i, node in enumerate(nodes):
        consumer = fused.get(node) if fused else None
        members = groups.get(node) if groups else None
        for v in node.outputs + (consumer.outputs if consumer is not None else []):
            if v not in buffers:
                buffers[v] = backend.empty(v.shape, v.dtype.np)
        if members is not None:
            built = backend.group_builder(node.op).build(
                members, [[buffers[v] for v in m.inputs] for m in members],
                [[buffers[v] for v in m.outputs] for m in members])
        elif consumer is not None:
            ins = [buffers[v] for v in node.inputs]
            ins += [buffers[v] for v in consumer.inputs if v is not node.outputs[0]]
            built = backend.fused_builder(node.op, consumer.op)(
                node, consumer, ins, [buffers[v] for v in consumer.outputs])
        else:
            builder = backend.builder_for(node.op)
            if builder is None:
                raise NotImplementedError(f"backend {backend.name!r} has no kernel for op "
                                          f"{node.op.name!r} (node: {node.format()})")
            if micro_batch is not None and runs_per_micro_batch(node):
                node = dataclasses.replace(node, attrs={**node.attrs, "micro_batch": micro_batch})
            built = builder(node, [buffers[v] for v in node.inputs],
                            [buffers[v] for v in node.outputs])
        for step in built:
            steps.append(step)
            owners.append(i)
    return steps, owners


def constant_nodes(graph: Graph) -> list:
    """Indices of the nodes whose outputs are known when the plan is built, in program order:
    every input they read the values of (all but ``op.shape_inputs``) is a graph constant or
    such an output. The initial gradient is one: ``ones_like(loss)`` (the loss is read for its
    shape), its ``scalar_mul`` by 1/N and the ``broadcast_like`` of that. Never an op that writes
    its inputs or a micro-batch boundary op."""
    known = set(graph.constants.values())
    out = []
    for i, node in enumerate(graph.nodes):
        if node.written or node.op.micro_batch is not None:
            continue
        shape_inputs = node.op.shape_inputs
        if all(v in known for k, v in enumerate(node.inputs) if k not in shape_inputs):
            out.append(i)
            known.update(node.outputs)
    return out


def _parts(graph: Graph, schedule) -> dict:
    """Node index -> 0, 1 or 2: before, during (once per micro-batch) or after the micro-batches
    of ``schedule`` (``graph.micro_batch_schedule()``, computed here when None)."""
    schedule = graph.micro_batch_schedule() if schedule is None else schedule
    return {i: p for p, group in enumerate((schedule.before, schedule.each, schedule.after))
            for i in group}


def fused_pairs(graph: Graph, backend, skip, schedule=None) -> dict:
    """``{producer index: consumer index}`` of the node pairs the backend builds as one
    (``Backend.fused_builder``; e.g. on cuda ``reduce_sum`` then ``scalar_mul``, the mean loss):
    the producer's single output is read by the consumer alone and is no graph result, both run
    in the same part of the micro-batch schedule (neither a boundary op), and every other input
    of the consumer exists before the producer runs. Nodes in ``skip`` take part in none;
    ``schedule``: the graph's ``micro_batch_schedule()`` when the caller has it."""
    nodes, users = graph.nodes, graph.users()
    index = {n: i for i, n in enumerate(nodes)}
    results = set(graph.results.values()) | set(graph.outputs)
    part = _parts(graph, schedule)
    pairs, taken = {}, set(skip)
    for i, node in enumerate(nodes):
        if i in taken or len(node.outputs) != 1 or node.outputs[0] in results:
            continue
        readers = users.get(node.outputs[0], [])
        if len(readers) != 1:
            continue
        c = index[readers[0]]
        consumer = nodes[c]
        if (c in taken or part.get(i) != part.get(c) or node.op.micro_batch is not None
                or consumer.op.micro_batch is not None
                or backend.fused_builder(node.op, consumer.op) is None):
            continue
        if any(v.producer is not None and index.get(v.producer, -1) > i
               for v in consumer.inputs if v is not node.outputs[0]):
            continue
        pairs[i] = c
        taken.update((i, c))
    return pairs


def grouped_nodes(graph: Graph, backend, skip, schedule=None) -> dict:
    """``{last member index: member indices}`` of the node groups the backend builds as one
    launch (``Backend.group_builder``; on cuda the optimizer updates of many parameters and the
    one-dimensional fused elementwise nodes of one expression, AMP's cast-and-unscale of every
    gradient).

    Members share the op type, the attributes, the input dtypes and the values of the group
    builder's shared inputs (``GroupBuilder.shared_inputs``: learning rate, ``skip_if``), and
    run in the same part of the micro-batch schedule. The group runs where its last member is,
    so a member joins only if moving the earlier ones there changes nothing: no node in between reads what a member
    writes or defines (its outputs) or writes what a member reads or writes, and no two members
    touch a value one of them writes or defines. Nodes in ``skip`` take part in none; groups of
    one are left out; ``schedule``: the graph's ``micro_batch_schedule()`` when the caller has
    it."""
    nodes = graph.nodes
    part = _parts(graph, schedule)
    open_groups: dict = {}          # key -> [members, Values read, Values written]
    groups = []
    for i, node in enumerate(nodes):
        written = set(node.written) | set(node.outputs)  # moved later, a member defines these later
        read = set(node.inputs)
        builder = None if i in skip else backend.group_builder(node.op)
        shared = None if builder is None else builder.shared_inputs(node)
        key = joined = None
        if shared is not None:
            key = (node.op.name, part.get(i), tuple(sorted(node.attrs.items())),
                   tuple(v.dtype.name for v in node.inputs), tuple(shared),
                   tuple(node.inputs[k] for k in shared))
            group = open_groups.get(key)
            if group is not None and not (read & group[2] or written & group[1]):
                joined = group
        for k, group in list(open_groups.items()):
            if group is not joined and (read & group[2] or written & group[1]):
                del open_groups[k]  # this node must see the members before it, or precede them
        if joined is not None:
            joined[0].append(i)
            joined[1] |= read
            joined[2] |= written
        elif key is not None:
            open_groups[key] = [[i], read, written]
            groups.append(open_groups[key][0])
    return {members[-1]: members for members in groups if len(members) > 1}


VIEW_OPS = ("reshape", "flatten")
"""Op types whose output can be a view of their input's buffer (:func:`allocate`)."""


def allocate(graph: Graph, buffers: dict, backend, skip=()) -> set:
    """Put a buffer for every node output of ``graph`` into ``buffers`` (those not there yet), in
    program order; returns the indices of the nodes that need no step, their output a view of
    their input's buffer: ``reshape`` / ``flatten`` (``Backend.view``), and ``transpose`` where
    the backend has a strided view (``Backend.transpose_view``) of its input for all of its
    readers, or of its output for the input's producer, the transpose its only reader (the
    producer then writes the transposed layout itself). Nodes in ``skip`` take part in none;
    no view is of a graph result.

    Every Value is written once per run, by its producer, before its readers: a view reads what
    a copy would. A variable's buffer is the exception (update ops write it in place, possibly
    after the reshape): a reshape of a variable copies, as one the backend cannot view does."""
    views = set()
    users = graph.users()
    results = set(graph.results.values()) | set(graph.outputs)
    index = {n: i for i, n in enumerate(graph.nodes)}
    into = {}                           # producer's output -> the transpose that reads it alone
    for i, node in enumerate(graph.nodes):
        x = node.inputs[0] if node.inputs else None
        if (node.op.name == "transpose" and i not in skip and x.producer is not None
                and index[x.producer] not in skip and users.get(x) == [node]
                and not {x, node.outputs[0]} & results):
            into[x] = i
    for i, node in enumerate(graph.nodes):
        x = node.inputs[0] if node.inputs else None
        for v in node.outputs:          # write the transpose's output in its layout
            j = into.get(v)
            if j is None or v in buffers or graph.nodes[j].outputs[0] in buffers:
                continue
            t = graph.nodes[j].outputs[0]
            moved = backend.empty(t.shape, t.dtype.np)
            inverse = tuple(int(k) for k in np.argsort(graph.nodes[j].attrs["perm"]))
            view = backend.transpose_view(moved, inverse, [node])
            if view is not None:
                buffers[t], buffers[v] = moved, view
                views.add(j)
        if (x is not None and node.outputs and i not in skip and x.kind != "variable"
                and node.outputs[0] not in buffers):
            view = None
            if node.op.name in VIEW_OPS:
                view = backend.view(buffers[x], node.outputs[0].shape)
            elif node.op.name == "transpose" and node.outputs[0] not in results:
                view = backend.transpose_view(buffers[x], node.attrs["perm"],
                                              users.get(node.outputs[0], []))
            if view is not None:
                buffers[node.outputs[0]] = view
                views.add(i)
        for v in node.outputs:
            if v not in buffers:
                buffers[v] = backend.empty(v.shape, v.dtype.np)
    return views


def _scheduled_steps(graph: Graph, buffers: dict, backend):
    """``(steps, owners, once_steps, once_owners)`` of the whole graph (owners: indices into
    ``graph.nodes``): the constant nodes' steps (:func:`constant_nodes`), run once; the others in
    the micro-batch schedule, the boundary ops built per micro-batch, the other nodes' steps
    built once, :func:`fused_pairs` and :func:`grouped_nodes` built as one; the views of
    :func:`allocate` none."""
    schedule, nodes = graph.micro_batch_schedule(), graph.nodes
    once = constant_nodes(graph)
    pairs = fused_pairs(graph, backend, once, schedule)
    fused = {nodes[p]: nodes[c] for p, c in pairs.items()}
    grouped = grouped_nodes(graph, backend, set(once) | set(pairs) | set(pairs.values()),
                            schedule)
    groups = {nodes[last]: [nodes[i] for i in members] for last, members in grouped.items()}
    skip = set(once) | set(pairs.values()) | {i for m in grouped.values() for i in m[:-1]}
    # first: constant nodes may read later values' shapes
    skip |= allocate(graph, buffers, backend, skip | set(pairs) | set(grouped))
    steps, owners = [], []

    def build(indices, micro_batch=None) -> dict:
        built, built_owners = build_steps([nodes[i] for i in indices], buffers, backend,
                                          micro_batch, fused, groups)
        per_node: dict = {}
        for step, k in zip(built, built_owners):
            per_node.setdefault(indices[k], []).append(step)
        return per_node

    def append(per_node: dict, indices) -> None:
        for i in indices:
            for step in per_node.get(i, ()):
                steps.append(step)
                owners.append(i)

    constant = build(once)
    once_steps = [step for i in once for step in constant.get(i, ())]
    once_owners = [i for i in once for _ in constant.get(i, ())]
    before, each_nodes, after = ([i for i in part if i not in skip]
                                 for part in (schedule.before, schedule.each, schedule.after))
    append(build(before), before)
    each = build(each_nodes, 0)
    boundary = [i for i in each_nodes if runs_per_micro_batch(nodes[i])]
    for k in range(schedule.count):
        if k:
            each.update(build(boundary, k))
        append(each, each_nodes)
    append(build(after), after)
    return steps, owners, once_steps, once_owners


class Plan:
    """A runnable form of one compiled :class:`~miniflow.ir.Graph` for one input signature.

    Args:
        graph: a verified graph whose variables all have data in ``graph.variable_data``
            (arrays of ``backend``, shared with the modules and optimizers that own them).
        backend: the backend whose kernels and memory the plan uses.
        context: what the compile driver keeps with the plan (``nn.Graph``: the passes'
            ``CompileContext``, e.g. the names behind the ``"nonfinite_counts"`` result).
        collective: every rank of the MPI world builds this plan now (``Backend.begin_plan``).
    """

    def __init__(self, graph: Graph, backend, context=None, collective: bool = False):
        self.graph = graph
        self.backend = backend
        self.context = context
        buffers: dict = {}
        self.input_buffers = []
        for v in graph.inputs:
            buffers[v] = backend.empty(v.shape, v.dtype.np)
            self.input_buffers.append(buffers[v])
        for name, v in graph.variables.items():
            buffers[v] = check_owned(backend, graph.variable_data[name], f"variable %{name}")
        for name, data in graph.constant_data.items():
            buffers[name] = backend.from_numpy(data)
        for v in [v for n in graph.nodes for v in n.inputs] + list(graph.results.values()):
            if v.kind == "constant":
                buffers[v] = buffers[v.name]
        backend.begin_plan(collective)
        self.steps, self._owners, self.once_steps, self._once_owners = _scheduled_steps(
            graph, buffers, backend)
        self.output_buffers = [buffers[v] for v in graph.outputs]
        self.buffers = buffers
        """Value of ``graph`` (Values hash by identity; the plan holds the graph, so they live as
        long as it) -> its backend array; also constant name -> array."""
        self._stage = backend.input_stager(self.input_buffers)
        self._copiers = [backend.output_copier(b) for b in self.output_buffers]
        self._calls = self._call_steps = None
        self.how = None
        """How the steps run (``Backend.prepare``'s note), once the plan has run."""
        self.state: dict = {}
        """What the compile driver keeps per plan (``nn.Graph``: the scaler's read-backs)."""

    def run(self, arrays, to_host: bool = True) -> list:
        """Copy ``arrays`` into the input buffers, run every step, return copies of the outputs:
        NumPy arrays (``to_host``), or backend arrays (device memory on cuda: no host round trip;
        a later run never changes them).

        When kernels compiled in this run, Python's garbage is collected once before it returns:
        Numba's compiler leaves reference cycles that hold frame objects of the calling stack
        (walked through ``f_back``), so the callers' frames (``nn.Graph``'s call holding these
        outputs) would keep their locals, the first outputs included (device memory on cuda),
        until the next full collection.

        Raises:
            the kernel's exception type, with a message naming the node that failed.
        """
        self._stage(arrays)
        token = self.backend.begin_run()
        try:
            if self._calls is not None:
                self._execute(self._calls, self._call_steps, self._owners)
            else:                   # kernels compile (or load from the cache) at the first run
                with compile_notice() as heard:
                    once, once_steps, _ = self.backend.prepare(self.once_steps)
                    self._execute(once, once_steps, self._once_owners)
                    self._calls, self._call_steps, self.how = self.backend.prepare(self.steps)
                    self._execute(self._calls, self._call_steps, self._owners)
                if heard.compiled:  # free the compiler's frames now (see the docstring)
                    gc.collect()
        finally:
            self.backend.end_run(token)
        if to_host:
            return [self.backend.to_numpy(b) for b in self.output_buffers]
        return [copy() for copy in self._copiers]

    def _execute(self, calls, call_steps, owners) -> None:
        """Run ``calls`` (``call_steps[k]``: the step call ``k`` runs, of which ``owners`` gives
        the node): the hot loop (no index kept; a failure finds its call afterwards).

        Floating-point warnings are off for the loop: the NumPy-backed steps (BLAS matmul) follow
        the Numba kernels' IEEE semantics, where inf and NaN are values (the loss scaler counts
        them), not warnings printed on every overflowing step."""
        fn = args = None
        try:
            with np.errstate(all="ignore"):
                for fn, args in calls:
                    fn(*args)
        except Exception as e:  # name the failing node, keep the exception type where we can
            c = next(c for c, (f, a) in enumerate(calls) if f is fn and a is args)
            k = call_steps[c]
            if k is None:
                raise RuntimeError(f"while running the plan ({self.how}): {e}") from e
            i = owners[k]
            node = self.graph.nodes[i]
            msg = f"while running node {i} `{node.format(self.graph.names())}`: {e}"
            diagnose = node.op.diagnose
            if diagnose is not None:
                detail = diagnose(node, [self.backend.to_numpy(self.buffers[v])
                                         for v in node.inputs])
                msg += f"; {detail}" if detail else ""
            cls = type(e) if isinstance(e, (ValueError, TypeError, IndexError)) else RuntimeError
            raise cls(msg) from e

    def __len__(self) -> int:
        return len(self.steps)

    def describe(self) -> str:
        """One line per step: the node it belongs to and the kernel's name; the steps run once,
        at the first run (:func:`constant_nodes`), first, marked ``once``."""
        lines = []
        for steps, owners, mark in ((self.once_steps, self._once_owners, " once"),
                                    (self.steps, self._owners, "")):
            for (fn, _), i in zip(steps, owners):
                name = (getattr(fn, "__name__", None)
                        or getattr(getattr(fn, "py_func", None), "__name__", "?"))
                lines.append(f"{i:4d} {self.graph.nodes[i].op.name:<34s} {name}{mark}")
        return "\n".join(lines)

