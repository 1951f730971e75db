"""``miniflow.onnx.export``: an ``nn.Graph`` or a Module as an ONNX model, at any stage of the
pass pipeline.

Two kinds of export (PyTorch's ``torch.onnx.export`` is the model for the first):

* ``after=None`` (default), the inference graph as it runs: every pass applied (AMP's casts and
  float16 compute included, fused elementwise chains expanded to their ONNX ops) and only
  standard ONNX operators, so onnxruntime runs it. A node without a standard form raises
  :class:`OnnxExportError` naming the op and the opset (LayerNormalization exists from 17) or
  the stages to export at instead.
* ``after="<stage>"`` (``"trace"``, a pass name of ``nn.Graph.stages``, ``"amp"`` for
  ``auto_mixed_precision``), any graph, training graphs included: ops with a standard form as
  above, the others (updates, gradients, identities, ``multi_count_not_finite``, ...) in the
  ``ai.miniflow`` domain with their attributes, so a learner can open every stage in Netron.

A bfloat16 AMP graph exports as valid ONNX (``BFLOAT16`` tensors; a convolution from
``opset=22``, where ONNX's ``Conv`` takes them), but onnxruntime's CPU
provider has no bfloat16 ``Gemm`` or ``Conv`` kernel, so it does not run there.

Every ONNX node carries its IR node (the line ``print(graph.ir)`` shows) and AMP color in its
``doc_string`` and ``metadata_props`` (``miniflow.amp_color``: white, black, gray, clear,
unlisted, cast, or none when AMP did not color it). Values keep the printer's names
(``0``, ``1`` ..., inputs and variables by name), parameters and buffers are initializers with
their ``state_dict`` names, results are graph outputs by their result names (``output0``,
``loss``, ``grad:<variable>``), and a variable a node writes in place becomes a new value
``<variable>.new`` (an output of the node and of the graph), as ONNX's training ops
(``ai.onnx.preview.training.Momentum``) return their updated tensors.
"""
from __future__ import annotations

import numpy as np

from .. import __version__
from ..extras import require
from ..checks import is_integer
from ..compiler import Graph
from ..nn.module import Module
from ..passes.pipeline import STAGE_ALIASES
from ..runtime.backend import get_backend
from ..serialization import check_save_path, write_atomic
from .convert import DOMAIN, Builder, NoStandardForm, standard_form, tensor_type

__all__ = ["export", "to_model", "OnnxExportError", "DEFAULT_OPSET", "MIN_OPSET"]

DEFAULT_OPSET = 17
"""The default opset (``torch.onnx.export``'s default in PyTorch 2.0 to 2.4)."""
MIN_OPSET = 15
"""The oldest opset exported: BatchNormalization takes float16 x with float32 statistics from 15."""


class OnnxExportError(ValueError):
    """A graph cannot be exported as asked (a node without a standard ONNX form in an inference
    export, a bad opset or stage); the message names the node and what to do."""


class _ModuleGraph(Graph):
    """The inference graph of a Module exported by itself (``build`` calls it)."""

    def __init__(self, module: Module):
        super().__init__()
        self.model = module

    def build(self, *inputs):
        return self.model(*inputs)


_OWNER, _WHAT = "miniflow.onnx.export", "an ONNX export"
"""How the path errors name the writer and what it writes (``serialization.write_atomic``)."""


def export(graph_or_module, example_inputs, path, *, opset: int | None = None,
           after: str | None = None, opset_version: int | None = None, input_names=None,
           output_names=None, **torch_keywords):
    """Export ``graph_or_module`` traced with ``example_inputs`` to the ONNX file ``path``.

    Args:
        graph_or_module: an ``nn.Graph`` (exported with its modules in their current modes and
            its configuration: AMP, optimizers, grad scaler) or a ``Module`` (exported in eval
            mode, as ``torch.onnx.export``'s default ``training=TrainingMode.EVAL``; its modes
            are restored after).
        example_inputs: one array or Tensor (a list is one input, an array's data), or a tuple
            of them: the inputs of ``build`` (or ``forward``), as ``torch.onnx.export``'s
            ``args``; their shapes and dtypes are the model's, the batch size included (the
            file's inputs have fixed shapes: export again for another).
        path: the ``.onnx`` file, written atomically (nothing is left behind on an error) as
            ``miniflow.save`` writes a checkpoint: through a symlink, keeping a replaced file's
            permission bits, never over a folder, device or FIFO (checked before tracing).
        opset: the default domain's opset version, ``MIN_OPSET`` to the newest the installed
            onnx knows (Gelu is an ONNX op from 20; before it, its erf form); None:
            ``DEFAULT_OPSET``. ``opset_version`` is ``torch.onnx.export``'s name for it.
        after: None (the inference graph with standard ops only, see the module docstring) or
            the stage to export with miniflow-only ops in the ``ai.miniflow`` domain.
        input_names, output_names: ``torch.onnx.export``'s: lists of names for the file's
            first inputs and outputs (None: ``build``'s argument names, or ``input0`` ... for
            a Module, and the result names).

    Returns:
        the ``onnx.ModelProto`` written (``onnx.checker.check_model(..., full_check=True)``
        passed on it).

    Raises:
        miniflow.extras.MissingExtraError: onnx is not installed (install the ``onnx`` extra).
        OnnxExportError: a node with no standard form when ``after`` is None (naming it, and
            the opset or the stages to export at instead); an opset out of range; ``after`` not
            a stage.
        TypeError: ``graph_or_module`` is neither an nn.Graph nor a Module; both ``opset``
            and ``opset_version``; names that are not a list of str, more names than inputs
            or outputs, a name given twice or already a value's (a parameter's); any other
            keyword (``torch.onnx.export``'s ``dynamic_axes``: the shapes are fixed).
        FileNotFoundError / IsADirectoryError / OSError: ``path``'s folder does not exist /
            ``path`` is a folder / a device, FIFO or socket; or writing failed.
    """
    onnx = require("onnx", "onnx", "miniflow.onnx.export")
    opset = _opset(opset, opset_version, torch_keywords)
    names = (_names("input_names", input_names), _names("output_names", output_names))
    check_save_path(path, _OWNER, _WHAT)
    newest = onnx.defs.onnx_opset_version()
    if not is_integer(opset) or not MIN_OPSET <= opset <= newest:
        raise OnnxExportError(f"miniflow.onnx.export: opset must be an integer from {MIN_OPSET} "
                              f"to {newest} (the installed onnx's newest), got {opset!r}")
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    if isinstance(graph_or_module, Module):
        modules = list(graph_or_module.modules())
        modes = [m.training for m in modules]
        graph_or_module.eval()
        try:
            return _export(onnx, _ModuleGraph(graph_or_module), inputs, path, opset, after,
                           "model.", names)
        finally:
            for m, mode in zip(modules, modes):
                m.training = mode
    if not isinstance(graph_or_module, Graph):
        raise TypeError(f"miniflow.onnx.export: expected an nn.Graph or a Module, got "
                        f"{type(graph_or_module).__name__}")
    return _export(onnx, graph_or_module, inputs, path, opset, after, "", names)


def _opset(opset, opset_version, torch_keywords: dict):
    """:func:`export`'s opset, given as ``opset`` or ``opset_version`` (or neither: the default);
    ``torch_keywords`` must be empty.

    Raises:
        TypeError: both given; a keyword in ``torch_keywords`` (naming it)."""
    if "dynamic_axes" in torch_keywords:
        raise TypeError("miniflow.onnx.export: dynamic_axes: the file's inputs have the "
                        "examples' fixed shapes, batch size included (a miniflow graph is built "
                        "per input shape); leave dynamic_axes out and export once per batch size "
                        "you run")
    if torch_keywords:
        raise TypeError(f"miniflow.onnx.export: no keyword {next(iter(torch_keywords))!r}; it "
                        "takes opset (or torch.onnx.export's opset_version), after, input_names "
                        "and output_names")
    if opset is not None and opset_version is not None:
        raise TypeError("miniflow.onnx.export: opset and opset_version (torch.onnx.export's "
                        "name) are one setting; give the opset once")
    chosen = opset if opset is not None else opset_version
    return DEFAULT_OPSET if chosen is None else chosen


def _names(what: str, names) -> list | None:
    """``input_names`` / ``output_names`` as a list of str (None stays None).

    Raises:
        TypeError: not a list or tuple of str."""
    if names is None:
        return None
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"miniflow.onnx.export: {what} must be a list of str (one name per "
                        f"value, in order), got {type(names).__name__} {names!r:.60}")
    return list(names)


def _rename(model, input_names, output_names) -> None:
    """Give ``model``'s first graph inputs and outputs the names asked, in every node too.

    Raises:
        TypeError: more names than values, a name twice, or a name another value has."""
    g = model.graph
    renames = {}
    for what, names, values in (("input", input_names, g.input),
                                ("output", output_names, g.output)):
        if names is not None and len(names) > len(values):
            raise TypeError(f"miniflow.onnx.export: {len(names)} {what}_names for "
                            f"{len(values)} {what}(s) ({', '.join(v.name for v in values)})")
        renames.update(zip((v.name for v in values), names or ()))
    taken = ({i.name for i in g.initializer} | {v.name for v in g.input}
             | {n for node in g.node for n in node.output}) - set(renames)
    seen = set()
    for new in renames.values():
        if new in taken or new in seen:
            raise TypeError(f"miniflow.onnx.export: the name {new!r} is taken (given twice, or "
                            "a parameter's or another value's); give other input_names / "
                            "output_names")
        seen.add(new)
    for node in g.node:
        node.input[:] = [renames.get(n, n) for n in node.input]
        node.output[:] = [renames.get(n, n) for n in node.output]
    for v in list(g.input) + list(g.output) + list(g.value_info):
        v.name = renames.get(v.name, v.name)


def _export(onnx, graph: Graph, inputs: tuple, path, opset: int, after, strip: str,
            names: tuple = (None, None)):
    try:
        ir = graph.lower(*inputs, after=after)
    except ValueError as e:
        if after is not None and "is no stage" in str(e):
            raise OnnxExportError(f"miniflow.onnx.export: {e}") from None
        raise
    stage = STAGE_ALIASES.get(after, after) or graph.stages(*inputs)[-1]
    try:
        model = to_model(onnx, ir, opset, stage=stage, strict=after is None, strip=strip)
    except OnnxExportError as e:
        raise OnnxExportError(f"{e}\n{_hint(onnx, graph, inputs, ir, opset)}") from None
    _rename(model, *names)
    onnx.checker.check_model(model, full_check=True)
    write_atomic(path, model.SerializeToString(), _OWNER, _WHAT)
    return model


def _hint(onnx, graph: Graph, inputs: tuple, ir, opset: int) -> str:
    """What to do instead of exporting ``ir`` (the graph as it runs) at ``opset``: the lowest
    higher opset at which it has standard ONNX ops only (LayerNormalization exists from 17),
    if any; the latest stage with standard ops only at ``opset``, if any; else every stage,
    with the miniflow-only ops in the ``ai.miniflow`` domain."""
    stages = graph.stages(*inputs)
    standard = None
    for stage in stages:
        if _exports(onnx, graph.lower(*inputs, after=stage), opset):
            standard = stage
    newest = onnx.defs.onnx_opset_version()
    higher = next((o for o in range(opset + 1, newest + 1) if _exports(onnx, ir, o)), None)
    at_stage = None if standard is None else (
        f"at after={standard!r} for the latest stage with standard ONNX ops only (without what "
        f"the later passes do: {', '.join(stages[stages.index(standard) + 1:])})")
    if higher is not None:
        return (f"Export with opset={higher} or later (this graph has standard ONNX ops only "
                f"from opset {higher}; opset={opset} was asked)"
                + (f", or {at_stage}." if at_stage else "."))
    custom = (f"pass after={stages[-1]!r} (the graph as it runs) or another stage of "
              f"{', '.join(stages)} to write the miniflow-only ops in the {DOMAIN!r} domain")
    if at_stage is None:
        return f"No stage of this graph has standard ONNX ops only: {custom}."
    return f"Export {at_stage}, or {custom}."


def _exports(onnx, ir, opset: int) -> bool:
    """Whether ``ir`` has standard ONNX ops only at ``opset`` (:func:`to_model` takes it)."""
    try:
        to_model(onnx, ir, opset)
    except OnnxExportError:
        return False
    return True


def to_model(onnx, ir, opset: int = DEFAULT_OPSET, *, stage: str = "", strict: bool = True,
             strip: str = ""):
    """The ``onnx.ModelProto`` of IR graph ``ir`` (see the module docstring); not checked.

    Args:
        onnx: the imported onnx package.
        stage: the stage's name, recorded in the model's metadata (``miniflow.stage``).
        strict: standard operators only; else nodes without a standard form go to the
            ``ai.miniflow`` domain.
        strip: a prefix removed from the variables' names (``"model."`` for a Module exported by
            itself: the initializers then carry its own ``state_dict`` names).

    Raises:
        OnnxExportError: ``strict`` and a node without a standard form (naming it).
    """
    names = ir.names()
    name = _onnx_names(ir, names, strip)
    read = {v for n in ir.nodes for v in n.inputs} | set(ir.results.values())
    b = Builder(onnx, opset)
    graph_inputs = _inputs_and_initializers(onnx, ir, name, read, b)
    current, writes = _emit_nodes(onnx, ir, name, names, read, b, strict)
    outputs = _outputs(onnx, ir, name, current, writes, b)
    opsets = [onnx.helper.make_opsetid("", opset)]
    if any(n.domain == DOMAIN for n in b.nodes):
        opsets.append(onnx.helper.make_opsetid(DOMAIN, 1))
    graph = onnx.helper.make_graph(b.nodes, f"miniflow_{stage or 'graph'}", graph_inputs,
                                   outputs, initializer=b.initializers, value_info=b.value_info)
    model = onnx.helper.make_model(graph, opset_imports=opsets, producer_name="miniflow",
                                   producer_version=__version__,
                                   doc_string=f"miniflow IR after stage {stage!r}")
    # the oldest IR version that holds these opsets and node metadata (10): older runtimes load it
    model.ir_version = max(10, onnx.helper.find_min_ir_version_for(opsets, True))
    onnx.helper.set_model_props(model, {"miniflow.stage": stage})
    return model


def _onnx_names(ir, names: dict, strip: str) -> dict:
    """Value -> its ONNX name: inputs and variables by their own names (``strip`` removed from
    the variables'), the others by their printed names, a node output that is a result by the
    first result's name."""
    name = {v: v.name for v in ir.inputs}
    name.update((v, n[len(strip):] if n.startswith(strip) else n) for n, v in ir.variables.items())
    name.update((v, names[v]) for v in ir.constants.values() if v in names)
    for n in ir.nodes:
        name.update((v, names[v]) for v in n.outputs)
    for result, v in reversed(list(ir.results.items())):   # the first result name wins
        if v.kind == "node":
            name[v] = result
    return name


def _inputs_and_initializers(onnx, ir, name: dict, read: set, b) -> list:
    """The graph inputs (``ir``'s inputs, and the variables declared without data); the read
    variables with data and the read constants become ``b``'s initializers."""
    graph_inputs = [_value_info(onnx, name[v], v) for v in ir.inputs]
    to_numpy = get_backend().to_numpy
    for n, v in ir.variables.items():
        data = ir.variable_data.get(n)
        if v not in read:
            continue
        if data is None:   # declared without data (a half copy the driver binds): an input
            graph_inputs.append(_value_info(onnx, name[v], v))
        else:
            b.initializer(data if isinstance(data, np.ndarray) else to_numpy(data), name[v])
    for v in ir.constants.values():
        if v in read:
            b.initializer(ir.constant_data[v.name], name[v])
    return graph_inputs


def _emit_nodes(onnx, ir, name: dict, names: dict, read: set, b, strict: bool) -> tuple:
    """Every IR node as ONNX nodes of ``b`` (its standard form, else, unless ``strict``, one
    ``ai.miniflow`` node); returns ``(current, writes)``: per variable a custom node writes,
    its newest value's name and how often it was written.

    Raises:
        OnnxExportError: ``strict`` and a node without a standard form (naming it).
    """
    current, writes = {}, {}
    for i, node in enumerate(ir.nodes):
        ins = [current.get(v, name[v]) for v in node.inputs]
        outs = [name[v] for v in node.outputs]
        start = len(b.nodes)
        try:
            standard_form(node, ins, outs, b, read)
        except NoStandardForm as e:
            if strict:
                raise OnnxExportError(f"miniflow.onnx.export: node {i} ({node.op.name}) has no "
                                      f"standard ONNX form: {e.args[0]}\n    "
                                      f"{node.format(names)}") from None
            for v in node.written:
                writes[v] = writes.get(v, 0) + 1
                current[v] = f"{name[v]}.new" + (str(writes[v]) if writes[v] > 1 else "")
            b.custom(node, ins, outs + [current[v] for v in node.written])
        _annotate(onnx, b.nodes[start:], i, node, names)
    return current, writes


def _outputs(onnx, ir, name: dict, current: dict, writes: dict, b) -> list:
    """The graph outputs: every result under its name (an ``Identity`` where the value has
    another name), then the newest value of every written variable; the other node outputs
    are declared in ``b``'s value infos."""
    produced = {o for n in b.nodes for o in n.output}
    outputs, result_names = [], set()
    for result, v in ir.results.items():
        src = current.get(v, name[v])
        if src != result:   # a result that is a variable, an input, or a second name
            b.node("Identity", [src], [result])
            b.nodes[-1].doc_string = f"result {result!r}"
            entry = b.nodes[-1].metadata_props.add()
            entry.key, entry.value = "miniflow.result", result
        outputs.append(_value_info(onnx, result, v))
        result_names.add(result)
    outputs += [_value_info(onnx, current[v], v) for v in writes]
    declared = result_names | {o.name for o in outputs}
    for node in ir.nodes:
        for v in node.outputs:
            if name[v] in produced and name[v] not in declared:
                b.declare(name[v], v.dtype, v.shape)
    return outputs


def _value_info(onnx, name: str, v):
    return onnx.helper.make_tensor_value_info(name, tensor_type(onnx, v.dtype), list(v.shape))


def _annotate(onnx, protos, i: int, node, names: dict) -> None:
    """Name the ONNX nodes made for IR node ``i`` and give each its IR line and AMP color
    (``doc_string`` and ``metadata_props``)."""
    color = node.meta.get("amp_color") or "none"
    text = node.format(names)
    for k, proto in enumerate(protos):
        proto.name = f"{node.op.name}_{i}" + (f".{k}" if len(protos) > 1 else "")
        proto.doc_string = f"{text}\namp_color: {color}"
        for key, value in (("miniflow.op", node.op.name), ("miniflow.amp_color", color),
                           ("miniflow.node", str(i))):
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
