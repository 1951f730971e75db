"""Automatic mixed precision: color every node, run the white ones in the half type (float16 or
bfloat16), insert casts.

Assumes: autograd has run, so the graph holds the forward AND backward nodes, and the parameter
gradients (``graph.grads``) have no readers yet (the loss-scale and optimizer passes run later);
``graph.nodes`` is in topological order; ``ctx.settings.amp`` is an :class:`AmpConfig`.

Guarantees:

* Every node gets ``node.meta["amp_color"]``: ``"white"`` (runs in the half type ``amp.dtype``,
  float16 or bfloat16; "float16" below stands for either), ``"black"`` (black
  list or black propagation), else its list category (``"gray"``, ``"clear"``) or ``"unlisted"``;
  every non-white node runs in float32. Inserted casts get ``"cast"``.
* Casts, only on the edges between white and other nodes (OneFlow's ``InsertCastOp``), only of
  values that were float32: a float32 value read by a white node from a non-white producer (or a
  graph input, variable or constant) is cast to float16, right before its first white reader
  (``graph.inserting_before``), unless it is one of the op's no-cast inputs
  (``OpDef.no_cast_inputs``, OneFlow's ``REGISTER_NO_CAST_REGISTRY``: batch norm's moving
  statistics, gamma and beta stay float32 beside a float16 ``x``); a white node's float16 output
  read by a non-white node is cast back to float32 there, and a returned one (a user output) at
  the end. Outputs a white node keeps in float32 (batch norm's ``mean`` and ``inv_variance``, in
  the parameter dtype) are read as they are. One cast node per value and dtype, shared by all
  its readers.
* No-cast inputs are never cast, of white nodes or others: a node that is not white and reads a
  white node's float16 output through one (``cast_like``'s ``dtype_like``, which gives the dtype
  only) is re-inferred, so ``cast_like`` (``x.type_as(y)``) gives ``y``'s dtype after the pass,
  and its float16 output is then cast back to float32 for the nodes that are not white and the
  user outputs, as a white node's.
* White nodes' outputs are re-inferred (float16); other nodes keep their dtypes (but the one
  above). Values keep their
  identity, so the results (``loss``, gradients) and ``AutogradState.initial_grad`` stay valid.
  Parameter gradients made by white nodes stay float16: the optimizer stage casts them.
* Parameters are float32 master weights (else TypeError); they are read through casts, never changed.
* ``ctx.state[AmpState]``: an :class:`AmpState` (per node: color and the rule or neighbour that
  decided it, naming values as the graph after this pass prints them; the inserted casts; the
  no-cast inputs left float32), read by ``miniflow.amp.report``.

Coloring, exactly as OneFlow's ``AutoMixedPrecision::Apply`` (``oneflow/core/job_rewriter/
auto_mixed_precision.cpp``):

1. Black set. Walk up from black and gray nodes, collecting clear nodes that feed one of the
   collected nodes; then walk down from black nodes: a collected node with a black producer is black.
2. White set. Walk up from white nodes and from gray/clear sinks, collecting non-black gray/clear
   nodes with a collected consumer; then walk down from white nodes: a collected node with a white
   producer is white. So a gray node is white only between white nodes, or a white node and a sink.
3. Clear propagation. A non-black clear node with a white producer turns white (downward walk), then
   one with a white consumer (upward walk).

Every walk is :func:`_walk`, a port of ``DfsTopoGraphTraversal`` (``pass_util.cpp``). A sink is a
node without readers; a graph output counts as read by an unlisted node (OneFlow's ``output`` op), so
a returned loss is not a sink, while parameter gradients are. OneFlow lets only CUDA nodes with
outputs run in half; miniflow's CPU backend has true float16, so every node with outputs may.
As in OneFlow, a gray/clear sink in the black set can still join the white set when a producer is
white (the white walk does not exclude black start nodes); casts follow the white set.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..dtype import HALF_DTYPES, DType, as_dtype, float16, float32
from ..ir import Graph, Node, output_name
from ..ops import emitter

__all__ = ["AmpConfig", "AmpDecision", "AmpState", "auto_mixed_precision"]


@dataclass
class AmpConfig:
    """AMP settings of one graph: ``lists`` (a ``miniflow.amp.AmpLists``) and the half ``dtype``
    (float16 or bfloat16).

    Raises:
        TypeError: a dtype other than float16 or bfloat16.
    """

    lists: object
    dtype: DType = float16

    def __post_init__(self):
        try:
            dtype = as_dtype(self.dtype)
        except TypeError:
            dtype = None
        if dtype not in HALF_DTYPES:
            raise TypeError(f"enable_amp: dtype must be a half type, miniflow.float16 or "
                            f"miniflow.bfloat16, got {self.dtype!r}")
        self.dtype = dtype


@dataclass(eq=False)
class AmpDecision:
    """The color of one node and the rule or neighbour that decided it."""

    node: Node
    color: str
    reason: str


@dataclass
class AmpState:
    """What the pass decided, its state (``ctx.state[AmpState]``, read by ``miniflow.amp.report``):
    one decision per node it saw (graph order), the casts it inserted, the no-cast inputs it left
    float32 (``(node, input index, input name)``, white nodes only), and ``names``: Value -> name
    as the graph printed right after the pass shows it."""

    decisions: list = field(default_factory=list)
    casts: list = field(default_factory=list)
    names: dict = field(default_factory=dict)
    no_cast: list = field(default_factory=list)


# ---------------------------------------------------------------------------------- coloring
@dataclass
class _Topology:
    """Node-level edges: distinct producers and consumers of each node, and the sinks."""

    producers: dict
    consumers: dict
    sinks: set


def _topology(graph: Graph) -> _Topology:
    made_by = {v: n for n in graph.nodes for v in n.outputs}
    producers = {n: {} for n in graph.nodes}  # dicts as ordered sets
    consumers = {n: {} for n in graph.nodes}
    for n in graph.nodes:
        for v in n.inputs:
            p = made_by.get(v)
            if p is not None:
                producers[n][p] = None
                consumers[p][n] = None
    returned = set(graph.outputs)
    sinks = {n for n in graph.nodes
             if not consumers[n] and not any(v in returned for v in n.outputs)}
    return _Topology({n: list(p) for n, p in producers.items()},
                     {n: list(c) for n, c in consumers.items()}, sinks)


def _walk(order, fathers, is_start, is_satisfied, members: dict) -> dict:
    """OneFlow's ``DfsTopoGraphTraversal``, adding nodes to ``members`` (node -> witness).

    ``order`` is topological (reversed for an upward walk), so a node's fathers (its producers in a
    downward walk, its consumers in an upward one) are visited first. A node joins if it
    ``is_start`` (witness None), or if it ``is_satisfied`` and at least one father is already a
    member (the witness: the first such father).
    """
    for node in order:
        if is_start(node):
            members[node] = None
        elif is_satisfied(node):
            witness = next((f for f in fathers[node] if f in members), None)
            if witness is not None:
                members[node] = witness
    return members


def _allowed_half(node: Node) -> bool:
    """OneFlow's IsAllowedToRunWithHalf on a backend with float16: the node has outputs."""
    return bool(node.outputs)


@dataclass
class _Sets:
    """The sets the walks build, each node -> witness (see :func:`_walk`)."""

    category: dict
    near_black: dict    # OneFlow's upstream_or_part_of_black_and_gray
    black: dict
    near_white: dict    # OneFlow's upstream_or_part_of_white
    white: dict
    white_rule: dict    # white node -> "white walk" | "clear down" | "clear up"


def _color(graph: Graph, lists) -> _Sets:
    nodes, topo = graph.nodes, _topology(graph)
    cat = {n: lists.category(n.op.name) for n in nodes}
    up, down = nodes[::-1], nodes

    near_black = _walk(up, topo.consumers, lambda n: cat[n] in ("black", "gray"),
                       lambda n: cat[n] == "clear", {})
    black = _walk(down, topo.producers, lambda n: cat[n] == "black",
                  lambda n: n in near_black, {})

    def white_or_sink(n):
        return _allowed_half(n) and (cat[n] == "white"
                                     or (n in topo.sinks and cat[n] in ("gray", "clear")))

    near_white = _walk(up, topo.consumers, white_or_sink,
                       lambda n: n not in black and _allowed_half(n) and cat[n] in ("gray", "clear"),
                       {})
    white = _walk(down, topo.producers, lambda n: _allowed_half(n) and cat[n] == "white",
                  lambda n: n in near_white, {})
    rule = dict.fromkeys(white, "white walk")

    def clear_joins(n):
        return n not in white and n not in black and cat[n] == "clear" and _allowed_half(n)

    for name, order, fathers in (("clear down", down, topo.producers),
                                 ("clear up", up, topo.consumers)):
        _walk(order, fathers, lambda n: False, clear_joins, white)
        rule.update((n, name) for n in white if n not in rule)
    return _Sets(cat, near_black, black, near_white, white, rule)


def _label(node: Node, names: dict) -> str:
    """``"matmul %3"``: the op and its first output as ``names`` (``Graph.names``) prints it."""
    return f"{node.op.name} %{names[node.outputs[0]]}" if node.outputs else node.op.name


def _decide(node: Node, s: _Sets, names: dict) -> AmpDecision:
    """The color of ``node`` and a one-line reason naming the rule or neighbour."""
    cat = s.category[node]
    kind = cat or "unlisted"
    if node in s.white:
        return AmpDecision(node, "white", _white_reason(node, s, kind, names))
    if node in s.black:
        witness = s.black[node]
        if witness is None:
            return AmpDecision(node, "black", "black list")
        via = (f", and it feeds gray/black {_label(s.near_black[node], names)}" if cat == "clear"
               else "")
        return AmpDecision(node, "black",
                           f"{kind}: producer {_label(witness, names)} is black{via}")
    if cat is None and node.op.no_cast_inputs:     # cast_like
        return AmpDecision(node, kind, f"unlisted: its dtype follows its no-cast "
                                       f"{', '.join(node.op.no_cast_inputs.values())}, "
                                       f"half where a white node made it")
    if cat is None:
        return AmpDecision(node, kind, "unlisted: never float16, does not pass white through")
    if cat == "clear":
        return AmpDecision(node, kind, "clear: no white neighbour")
    if node in s.near_white:
        return AmpDecision(node, kind, "gray: leads to a white node or sink, no producer is white")
    return AmpDecision(node, kind, "gray: does not lead to a white node or sink")


def _white_reason(node: Node, s: _Sets, kind: str, names: dict) -> str:
    witness, rule = s.white[node], s.white_rule[node]
    if rule == "clear down":
        return f"clear: producer {_label(witness, names)} is white"
    if rule == "clear up":
        return f"clear: consumer {_label(witness, names)} is white"
    if witness is None:
        return "white list"
    ahead = s.near_white[node]
    to = "it is a sink" if ahead is None else f"it leads to white/sink via {_label(ahead, names)}"
    also = " (also black-propagated; casts follow the white set, as in OneFlow)" \
        if node in s.black else ""
    return f"{kind}: producer {_label(witness, names)} is white and {to}{also}"


# ---------------------------------------------------------------------------------- casts
def _reinfer(node: Node) -> None:
    """Set the output dtypes of a white node from its (now float16) inputs."""
    try:
        metas = node.op.infer(node.inputs, node.attrs)
    except (TypeError, ValueError) as e:
        name = node.op.name
        raise TypeError(f"auto_mixed_precision: {name} cannot run in {node.inputs[0].dtype.name} "
                        f"here: {e} "
                        f"(node: {node.format()}); put {name!r} in the black list with "
                        f"enable_amp(black_add=[{name!r}])") from None
    for v, (_, dtype) in zip(node.outputs, metas):
        v.dtype = dtype


def _insert_casts(graph: Graph, white: dict, half: DType) -> tuple:
    """Put casts on white/non-white edges (before the first reader of each cast) and on white
    user outputs (at the end); returns the cast nodes and the no-cast inputs left float32."""
    was_f32 = {v for n in white for v in n.outputs if v.dtype is float32}
    emit = emitter(graph)
    shared: dict = {}
    casts, kept = [], []

    def to_half(node, k, v):
        """Input ``k`` (``v``) of white ``node``: cast if it is a float32 value from outside the
        white set, unless the op never casts that input."""
        if v.dtype is not float32 or v.producer in white:
            return v
        if k in node.op.no_cast_inputs:
            kept.append((node, k, node.op.no_cast_inputs[k]))
            return v
        return cast(v, half)

    def half_output(v):
        """A white node's output that was float32 and is float16 now (not one kept float32)."""
        return v in was_f32 and v.dtype is not float32

    def cast(v, dtype):
        key = (v, dtype.name)
        if key not in shared:
            shared[key] = emit("cast", v, dtype=dtype)
            cast_node = shared[key].producer
            cast_node.meta["amp_color"] = "cast"
            casts.append(cast_node)
        return shared[key]

    for node in list(graph.nodes):
        with graph.inserting_before(node):
            if node in white:
                node.inputs = [to_half(node, k, v) for k, v in enumerate(node.inputs)]
                _reinfer(node)
            else:
                node.inputs = [v if k in node.op.no_cast_inputs or not half_output(v)
                               else cast(v, float32) for k, v in enumerate(node.inputs)]
                if any(half_output(node.inputs[k]) for k in node.op.no_cast_inputs
                       if k < len(node.inputs)):     # cast_like of a float16 dtype_like
                    was = {v for v in node.outputs if v.dtype is float32}
                    _reinfer(node)
                    was_f32.update(was)
    for i, v in enumerate(graph.outputs):
        if half_output(v):
            graph.results[output_name(i)] = cast(v, float32)
    return casts, kept


# ---------------------------------------------------------------------------------- the pass
def _check_master_weights(graph: Graph, ctx) -> None:
    for name in ctx.settings.param_names.values():
        v = graph.variables.get(name)
        if v is not None and v.dtype is not float32:
            raise TypeError(f"enable_amp: parameter {name!r} is {v.dtype.name}, but master weights "
                            f"must stay float32 under AMP (the pass casts them to float16 where "
                            f"white ops read them); keep the model in float32 instead of "
                            f"converting it to half")


def auto_mixed_precision(graph: Graph, ctx) -> Graph:
    """Color ``graph`` by ``settings.amp.lists`` and insert casts (see the module docstring);
    stores an :class:`AmpState`."""
    amp = ctx.settings.amp
    _check_master_weights(graph, ctx)
    sets = _color(graph, amp.lists)
    colored = list(graph.nodes)
    casts, kept = _insert_casts(graph, sets.white, amp.dtype)
    names = graph.names()
    decisions = [_decide(n, sets, names) for n in colored]
    for d in decisions:
        d.node.meta["amp_color"] = d.color
    ctx.state[AmpState] = AmpState(decisions, casts, names, kept)
    return graph
