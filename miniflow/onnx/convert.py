"""miniflow IR nodes as ONNX nodes: the standard form of each op that has one, and the
``ai.miniflow`` custom-domain form of any node.

:class:`Builder` collects the ONNX nodes, initializers and value types of one export; the
converters of :data:`CONVERTERS` (op type -> function) emit a node's standard form into it.
A converter raises :class:`NoStandardForm` before emitting anything when this node (these
attributes, these uses of its outputs) has no standard ONNX equivalent; the exporter then emits the
node in the custom domain (:meth:`Builder.custom`), or refuses (an inference export).

Standard forms (ONNX operator docs, onnx/docs/Operators.md; PyTorch's ``torch.onnx`` symbolic
functions are the model for the choices):

* ``matmul`` -> ``Gemm`` (transA, transB); ``bias_add`` -> ``Add`` (the bias reshaped to
  ``[C, 1, ...]`` when the axis is not the last); ``conv2d`` -> ``Conv`` (bfloat16 from opset
  22); ``masked_fill`` -> ``Where`` (``tril``'s too); ``normalization`` in
  eval mode (axis 1) -> ``BatchNormalization`` (x may be float16 with float32 statistics: opset
  15's T, T1, T2); ``max_pool_2d`` -> ``MaxPool`` when its indices are not read;
  ``avg_pool_2d`` -> ``AveragePool`` without ``divisor_override`` (both ``ceil_mode`` 0 with
  end padding where PyTorch's ceil rule drops a window ONNX's keeps); ``adaptive_avg_pool2d`` ->
  ``GlobalAveragePool`` for a 1x1 output, ``AveragePool`` when the input divides evenly;
  ``flatten`` -> ``Flatten`` (else ``Reshape``); ``reshape``, ``transpose``, ``reduce_sum``,
  ``add_n`` (``Sum``), ``broadcast_like`` (``Unsqueeze`` + ``Expand``), ``expand``, ``softmax``,
  ``log_softmax``, ``cast``, ``cast_like`` (``CastLike``, opset 15), ``ones_like`` and
  ``constant`` (``ConstantOfShape``),
  ``sparse_softmax_cross_entropy`` (``Softmax`` and ``SoftmaxCrossEntropyLoss``, reduction none),
  ``gather`` (``Gather``), ``dim_gather`` (``GatherElements``, axis = dim: ``torch.gather``'s
  export), ``dim_scatter_update`` (``_scalar``) and ``dim_scatter_add`` (``ScatterElements``,
  reduction none or add: ``torch.scatter`` / ``scatter_add``'s export), ``cumsum`` /
  ``cumsum_grad`` (``CumSum``, ``reverse`` 1 for the gradient); ``cumprod`` / ``cumprod_grad``
  have none (ONNX has no cumulative product): refused, saying so.
* Elementwise ops and ``fused_elementwise`` expressions by their scalar functions
  (:data:`FUNCTIONS`): ``relu`` -> ``Relu``, ``add`` -> ``Add`` ..., ``gelu`` -> ``Gelu`` from
  opset 20, before it its erf form ``x * 0.5 * (1 + Erf(x / sqrt(2)))``, ``silu`` -> ``x *
  Sigmoid(x)``, ``rsqrt`` -> ``Reciprocal(Sqrt(x))``, ``leaky_relu`` -> ``LeakyRelu(alpha)``,
  ``elu`` -> ``Elu(alpha)``. miniflow computes a function of half
  operands in float32 and rounds the result once; a decomposed function, or a number that the
  half type does not hold exactly, is computed the same way here (``Cast`` to float32 and back).

Everything else (updates, gradients, ``amp_white_identity``, ``multi_count_not_finite``,
``all_reduce``, micro-batch ops, training-mode batch norm ...) exists only in miniflow and goes to
the ``ai.miniflow`` domain with its attributes.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..dtype import DType, float32
from ..ops.amp_ops import AMP_IDENTITY_OPS
from ..ops.fused import CASTS, parse, term_dtype

__all__ = ["DOMAIN", "NoStandardForm", "Builder", "CONVERTERS", "FUNCTIONS", "tensor_type",
           "standard_form"]

DOMAIN = "ai.miniflow"
"""The ONNX domain of miniflow-only ops (reverse DNS, as ``com.microsoft`` is ORT's)."""

_TENSOR_TYPES = {"f16": "FLOAT16", "bf16": "BFLOAT16", "f32": "FLOAT", "f64": "DOUBLE",
                 "i64": "INT64"}


class NoStandardForm(Exception):
    """A node has no standard ONNX form; ``args[0]`` says why."""


def tensor_type(onnx, dtype: DType) -> int:
    """The ``onnx.TensorProto`` element type of a miniflow DType."""
    return getattr(onnx.TensorProto, _TENSOR_TYPES[dtype.short])


class Builder:
    """The nodes, initializers and value types of one ONNX graph being built.

    ``onnx`` is the imported onnx package, ``opset`` the default domain's opset version.
    """

    def __init__(self, onnx, opset: int):
        self.onnx, self.opset = onnx, opset
        self.nodes: list = []
        self.initializers: list = []
        self.value_info: list = []
        self._count = 0

    def fresh(self, hint: str) -> str:
        """A new value name ``<hint>.<k>`` for an intermediate of a decomposition."""
        self._count += 1
        return f"{hint}.{self._count}"

    def node(self, op_type: str, inputs, outputs, domain: str = "", **attrs) -> list:
        """Append an ONNX node; ``outputs`` is a list of names or a count of fresh ones (named
        after ``op_type``). Returns the output names."""
        if isinstance(outputs, int):
            outputs = [self.fresh(op_type) for _ in range(outputs)]
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), list(outputs),
                                                     domain=domain, **attrs))
        return outputs

    def initializer(self, array: np.ndarray, name: str | None = None) -> str:
        """Add ``array`` as an initializer (a fresh name unless ``name``); returns its name."""
        name = name or self.fresh("const")
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values) -> str:
        """An int64 1-D initializer (shapes, axes)."""
        return self.initializer(np.asarray(values, np.int64).reshape(-1))

    def declare(self, name: str, dtype: DType, shape) -> None:
        """Record the type of intermediate value ``name`` (``value_info``: Netron shows it; the
        full check compares it with ONNX's shape inference)."""
        self.value_info.append(self.onnx.helper.make_tensor_value_info(
            name, tensor_type(self.onnx, dtype), list(shape)))

    def custom(self, node, ins: list, outs: list) -> None:
        """``node`` in the ``ai.miniflow`` domain: its op type, inputs, ``outs`` (its outputs,
        then the new values of the variables it writes) and its attributes."""
        attrs = {k: _attribute(self.onnx, k, v) for k, v in node.attrs.items()}
        self.nodes.append(self.onnx.helper.make_node(node.op.name, ins, outs, domain=DOMAIN))
        self.nodes[-1].attribute.extend(attrs.values())


def _attribute(onnx, key: str, value):
    """A miniflow attribute as an ONNX AttributeProto: bools and integers as INT, reals as FLOAT,
    strings and dtypes (by their short name, ``f16``) as STRING, tuples of numbers as INTS /
    FLOATS, anything else as its text."""
    A = onnx.AttributeProto
    if isinstance(value, DType):
        value = value.short
    if isinstance(value, tuple) and all(isinstance(v, numbers.Real) for v in value):
        integral = all(isinstance(v, numbers.Integral) for v in value)
        return onnx.helper.make_attribute(key, [int(v) if integral else float(v) for v in value],
                                          attr_type=A.INTS if integral else A.FLOATS)
    if isinstance(value, numbers.Integral):
        return onnx.helper.make_attribute(key, int(value))
    if isinstance(value, numbers.Real):
        return onnx.helper.make_attribute(key, float(value))
    return onnx.helper.make_attribute(key, value if isinstance(value, str) else repr(value))


# ----------------------------------------------------------------------------- elementwise
def _onnx_op(op_type):
    return lambda b, args, out, dt: b.node(op_type, args, [out])


def _gelu(b, args, out, dt):
    """x * Phi(x) = x * 0.5 * (1 + erf(x / sqrt 2)): ONNX's Gelu from opset 20, its erf form
    before (as ``torch.onnx``'s symbolic for ``gelu`` before opset 20)."""
    if b.opset >= 20:
        return b.node("Gelu", args, [out])
    x = args[0]
    c = lambda v: b.initializer(np.array(v, dt.np))  # noqa: E731
    erf = b.node("Erf", b.node("Mul", [x, c(math.sqrt(0.5))], 1), 1)
    half_x = b.node("Mul", [x, c(0.5)], 1)
    return b.node("Mul", half_x + b.node("Add", erf + [c(1.0)], 1), [out])


def _softplus(b, args, out, dt):
    """PyTorch's ``softplus(x, beta, threshold)``: ``Where(z > threshold, x, Softplus(z) / beta)``
    with ``z = x * beta``. ONNX's Softplus has neither attribute, so the export composes them
    (``torch.onnx``'s symbolic composes beta the same way and leaves the threshold out)."""
    x, beta, threshold = args
    z = b.node("Mul", [x, beta], 1)
    soft = b.node("Div", b.node("Softplus", z, 1) + [beta], 1)
    return b.node("Where", b.node("Greater", z + [threshold], 1) + [x] + soft, [out])


def _softplus_derivative(b, args, out, dt):
    """``Where(x * beta > threshold, 1, Sigmoid(x * beta))`` (a training stage's export)."""
    x, beta, threshold = args
    z = b.node("Mul", [x, beta], 1)
    one = b.initializer(np.array(1.0, dt.np))
    return b.node("Where", b.node("Greater", z + [threshold], 1) + [one]
                  + b.node("Sigmoid", z, 1), [out])


def _with_attribute(op_type: str, attribute: str):
    """The emitter of an ONNX operator that takes the function's one scalar attribute as an ONNX
    attribute, not an input (``LeakyRelu(alpha)``, ``Elu(alpha)``): marked ``numbers``, so that
    :func:`_apply` hands it the attribute as a number (always one: a node's attributes and a
    fused expression's are numbers) instead of an initializer's name."""
    def emit(b, args, out, dt):
        x, value = args
        return b.node(op_type, [x], [out], **{attribute: float(value)})
    emit.numbers = True
    return emit


FUNCTIONS = {
    "neg": (_onnx_op("Neg"), False), "identity": (_onnx_op("Identity"), False),
    "exp": (_onnx_op("Exp"), False), "log": (_onnx_op("Log"), False),
    "relu": (_onnx_op("Relu"), False), "tanh": (_onnx_op("Tanh"), False),
    "sigmoid": (_onnx_op("Sigmoid"), False), "reciprocal": (_onnx_op("Reciprocal"), False),
    "sqrt": (_onnx_op("Sqrt"), False), "absolute": (_onnx_op("Abs"), False),
    "sin": (_onnx_op("Sin"), True), "cos": (_onnx_op("Cos"), True),
    "floor": (_onnx_op("Floor"), True), "round_half_even": (_onnx_op("Round"), True),
    "power": (_onnx_op("Pow"), True), "clip": (_onnx_op("Clip"), False),
    "add": (_onnx_op("Add"), False), "sub": (_onnx_op("Sub"), False),
    "mul": (_onnx_op("Mul"), False), "div": (_onnx_op("Div"), False),
    "maximum": (_onnx_op("Max"), False), "minimum": (_onnx_op("Min"), False),
    "rsqrt": (lambda b, a, out, dt: b.node("Reciprocal", b.node("Sqrt", a, 1), [out]), True),
    "silu": (lambda b, a, out, dt: b.node("Mul", [a[0]] + b.node("Sigmoid", a, 1), [out]), True),
    "gelu": (_gelu, True), "softplus": (_softplus, True),
    "softplus_derivative": (_softplus_derivative, True),
    "leaky_relu": (_with_attribute("LeakyRelu", "alpha"), True),
    "elu": (_with_attribute("Elu", "alpha"), True),
}
"""Scalar function name -> (emit(builder, operand names, output name, dtype), decomposed): the
functions of the elementwise ops with a standard form; ``decomposed`` when it takes several ONNX
nodes (computed in float32 for half operands, rounded once, as miniflow does), or takes a scalar
attribute as an ONNX attribute (:func:`_with_attribute`: ONNX's Elu has no bfloat16, and
miniflow computes ``alpha * x`` in float32 and rounds once). An emitter gets the numbers among
its operands as initializers' names, or as numbers when it is marked ``numbers``."""


def _apply(b: Builder, fn: str, args: list, out: str, dt: DType) -> None:
    """Emit ``out = fn(*args)`` of dtype ``dt``; an arg is a value name or a number."""
    emit, decomposed = FUNCTIONS[fn]
    numbers_ = [a for a in args if not isinstance(a, str)]
    exact = all(float(np.array(v, dt.np)) == v or math.isnan(v) for v in numbers_)
    as_numbers = getattr(emit, "numbers", False)
    if not dt.is_half or (exact and not decomposed):
        emit(b, [a if isinstance(a, str) or as_numbers else b.initializer(np.array(a, dt.np))
                 for a in args], out, dt)
        return
    f32 = tensor_type(b.onnx, float32)
    wide = [b.node("Cast", [a], 1, to=f32)[0] if isinstance(a, str)
            else a if as_numbers else b.initializer(np.array(a, np.float32)) for a in args]
    tmp = b.fresh(fn)
    emit(b, wide, tmp, float32)
    b.node("Cast", [tmp], [out], to=tensor_type(b.onnx, dt))


def _elementwise(node, ins, outs, b):
    fn = node.op.scalar.__name__
    if node.op.name in AMP_IDENTITY_OPS:
        raise NoStandardForm(f"{node.op.name} only pins AMP colors (the prune_amp_identity pass "
                             "removes it)")
    if fn not in FUNCTIONS:
        raise NoStandardForm(f"its scalar function {fn!r} has no entry in "
                             "miniflow.onnx.convert.FUNCTIONS (an ONNX operator with the same "
                             "attributes)")
    _apply(b, fn, ins + list(node.op.scalar_args(node.attrs)), outs[0], node.outputs[0].dtype)


def _fused(node, ins, outs, b):
    program = parse(node.attrs["expr"])
    missing = sorted({t[1] for t in program.terms() if t[0] == "call"
                      and t[1] not in CASTS and t[1] not in FUNCTIONS})
    if missing:
        raise NoStandardForm(f"its expression uses {', '.join(missing)}, which ha"
                             f"{'s' if len(missing) == 1 else 've'} no ONNX operator")
    in_types = [v.dtype for v in node.inputs]
    env, types = {}, {}
    out_of = dict(zip(program.outputs, outs))

    def emit(term, out=None):
        kind = term[0]
        if kind == "num":
            return float(term[1])
        if kind in ("x", "ref"):
            name = ins[term[1]] if kind == "x" else env[term[1]]
            return b.node("Identity", [name], [out])[0] if out else name
        fn, args = term[1], term[2]
        dt = term_dtype(term, in_types, types)
        out = out or b.fresh(fn)
        operands = [emit(a) for a in args]
        if fn in CASTS and isinstance(operands[0], float):   # a cast number: a constant
            b.node("Identity", [b.initializer(np.array(operands[0], dt.np))], [out])
        elif fn in CASTS:
            b.node("Cast", operands, [out], to=tensor_type(b.onnx, dt))
        else:
            _apply(b, fn, operands, out, dt)
        return out

    for name, term in program.statements:
        types[name] = term_dtype(term, in_types, types)
        env[name] = emit(term, out_of.get(name))


# ----------------------------------------------------------------------------- other ops
def _matmul(node, ins, outs, b):
    if node.attrs.get("count_not_finite"):
        raise NoStandardForm("it also counts non-finite gradients (count_not_finite)")
    b.node("Gemm", ins, outs, transA=int(node.attrs["transpose_a"]),
           transB=int(node.attrs["transpose_b"]))


def _bias_add(node, ins, outs, b):
    x, bias = node.inputs
    trailing = len(x.shape) - node.attrs["axis"] - 1
    if trailing:
        ins = [ins[0], b.node("Reshape", [ins[1], b.ints(bias.shape + (1,) * trailing)], 1)[0]]
    b.node("Add", ins, outs)


def _conv2d(node, ins, outs, b):
    a = node.attrs
    if node.inputs[0].dtype.name == "bfloat16" and b.opset < 22:
        raise NoStandardForm(f"ONNX's Conv takes bfloat16 from opset 22, this export is opset "
                             f"{b.opset} (export with opset=22)")
    b.node("Conv", ins, outs, kernel_shape=list(a["kernel_size"]), strides=list(a["strides"]),
           pads=list(a["padding_before"]) * 2, dilations=list(a["dilation_rate"]),
           group=a["groups"])


def _normalization(node, ins, outs, b):
    a = node.attrs
    if a["training"]:
        raise NoStandardForm("in training mode it writes its moving statistics in place")
    if a["axis"] != 1:
        raise NoStandardForm(f"ONNX normalizes axis 1, this node axis {a['axis']}")
    x, mean, var, gamma, beta = ins
    b.node("BatchNormalization", [x, gamma, beta, mean, var], outs, epsilon=a["epsilon"],
           momentum=a["momentum"])


def _pool_attrs(node, include_pad: bool = False) -> dict:
    """ONNX's pooling attributes of ``node``. Where ``ceil_mode``'s ceil rule gives ONNX's
    shape inference (onnx 1.23) one window more than PyTorch, which drops a last window that
    would start in the right padding, ``ceil_mode`` is 0 and the windows PyTorch keeps are given
    as end padding instead: exact for MaxPool (padding never wins a window that holds an
    element of the input, as every window PyTorch keeps does) and for AveragePool without
    ``count_include_pad``; with it, padding past PyTorch's own would count in a divisor where
    PyTorch's does not: no standard form then."""
    a = node.attrs
    kernel, stride, pad = a["kernel_size"], a["stride"], a["padding"]
    dilation = a.get("dilation", (1, 1))
    ends, dropped = [], False
    for size, out, k, s, p, d in zip(node.inputs[0].shape[2:], node.outputs[0].shape[2:],
                                     kernel, stride, pad, dilation):
        span = d * (k - 1) + 1
        dropped |= bool(a["ceil_mode"]) and -(-(size + 2 * p - span) // s) + 1 > out
        ends.append(max(p, (out - 1) * s + span - size - p))
    if not dropped:
        return {"kernel_shape": list(kernel), "strides": list(stride), "pads": list(pad) * 2,
                "ceil_mode": int(a["ceil_mode"])}
    if include_pad and any(e > p for e, p in zip(ends, pad)):
        raise NoStandardForm("with ceil_mode and count_include_pad its last window reaches "
                             "past the padding, which ONNX's AveragePool would count")
    return {"kernel_shape": list(kernel), "strides": list(stride), "pads": list(pad) + ends,
            "ceil_mode": 0}


def _max_pool(node, ins, outs, b, used):
    if node.outputs[1] in used:
        raise NoStandardForm("its argmax indices are read (ONNX's MaxPool numbers them "
                             "differently)")
    b.node("MaxPool", ins, outs[:1], dilations=list(node.attrs["dilation"]),
           **_pool_attrs(node))


def _avg_pool(node, ins, outs, b):
    a = node.attrs
    if a["divisor_override"]:
        raise NoStandardForm("ONNX's AveragePool has no divisor_override")
    b.node("AveragePool", ins, outs, count_include_pad=int(a["count_include_pad"]),
           **_pool_attrs(node, bool(a["count_include_pad"])))


def _adaptive_avg_pool(node, ins, outs, b):
    (h, w), (oh, ow) = node.inputs[0].shape[2:], node.attrs["output_size"]
    if (oh, ow) == (1, 1):
        b.node("GlobalAveragePool", ins, outs)
    elif h % oh == 0 and w % ow == 0:
        b.node("AveragePool", ins, outs, kernel_shape=[h // oh, w // ow],
               strides=[h // oh, w // ow])
    else:
        raise NoStandardForm(f"its windows over {h}x{w} -> {oh}x{ow} are uneven")


def _flatten(node, ins, outs, b):
    x, y = node.inputs[0], node.outputs[0]
    if len(y.shape) == 2 and node.attrs["start_dim"] == 1 and node.attrs["end_dim"] == len(
            x.shape) - 1:
        b.node("Flatten", ins, outs, axis=1)
    else:
        b.node("Reshape", [ins[0], b.ints(y.shape)], outs)


def _reduce_sum(node, ins, outs, b):
    b.node("ReduceSum", [ins[0], b.ints(node.attrs["axis"])], outs,
           keepdims=int(node.attrs["keepdims"]), noop_with_empty_axes=1)


def _broadcast_like(node, ins, outs, b):
    """``Expand`` to the output's shape; an ``x`` without the broadcast axes (the form of
    ``reduce_sum``'s gradient) is given them first (``Unsqueeze``), one that has them as size 1
    (``Tensor.expand``, a ``keepdims`` gradient) is expanded as it is."""
    removed = len(node.inputs[0].shape) < len(node.outputs[0].shape)
    x = b.node("Unsqueeze", [ins[0], b.ints(node.attrs["broadcast_axes"])], 1) \
        if removed else ins[:1]
    b.node("Expand", x + [b.ints(node.outputs[0].shape)], outs)


def _constant_of_shape(b, shape_name, out, value, dtype):
    b.node("ConstantOfShape", [shape_name], [out], value=b.onnx.numpy_helper.from_array(
        np.array([value], dtype.np)))


def _sce(node, ins, outs, b):
    b.node("Softmax", ins[:1], outs[:1], axis=-1)
    b.node("SoftmaxCrossEntropyLoss", ins, outs[1:], reduction="none")


def _swap_last(b, name: str, rank: int) -> str:
    """``name`` with its last two axes swapped (a Transpose)."""
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return b.node("Transpose", [name], 1, perm=perm)[0]


def _batch_matmul(node, ins, outs, b):
    """MatMul, the operands transposed first where the node says so."""
    if node.attrs.get("count_not_finite"):
        raise NoStandardForm("it also counts non-finite gradients (count_not_finite)")
    a, c = ins
    rank = len(node.inputs[0].shape)
    if node.attrs["transpose_a"]:
        a = _swap_last(b, a, rank)
    if node.attrs["transpose_b"]:
        c = _swap_last(b, c, rank)
    b.node("MatMul", [a, c], outs)


def _layer_norm(node, ins, outs, b, used):
    """LayerNormalization (opset 17) over the axes from ``begin_norm_axis``; its row statistics
    have another shape in ONNX ([..., 1, 1] against miniflow's rows), so only Y may be read."""
    a = node.attrs
    if b.opset < 17:
        raise NoStandardForm(f"ONNX's LayerNormalization exists from opset 17, this export "
                             f"asked for opset {b.opset} (export with opset=17 or later)")
    if a["begin_params_axis"] != a["begin_norm_axis"]:
        raise NoStandardForm("its parameters cover other axes than it normalizes")
    if set(node.outputs[1:]) & used:      # IR Values (outs are ONNX names)
        raise NoStandardForm("its row statistics (mean, inv_variance) are read")
    x = node.inputs[0]
    normalized = x.shape[a["begin_norm_axis"]:]
    dt = x.dtype.np
    scale = ins[1] if len(ins) > 1 else b.initializer(np.ones(normalized, dt))
    bias = ins[2] if len(ins) > 2 else b.initializer(np.zeros(normalized, dt))
    b.node("LayerNormalization", [ins[0], scale, bias], outs[:1], axis=a["begin_norm_axis"],
           epsilon=a["epsilon"])


def _slice(node, ins, outs, b):
    a = node.attrs
    axes = list(range(len(a["start"])))
    b.node("Slice", [ins[0], b.ints(a["start"]), b.ints(a["stop"]), b.ints(axes),
                     b.ints(a["step"])], outs)


def _slice_update(node, ins, outs, b):
    """ScatterND(ref, indices, value): the indices of every element of the slice, a constant of
    shape ``value.shape + [rank]`` (shapes are static), as OneFlow's ``slice_update`` writes
    value over ref."""
    a = node.attrs
    axes = [np.arange(*r) for r in zip(a["start"], a["stop"], a["step"])]
    indices = (np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1) if axes
               else np.zeros((0,), np.int64))
    b.node("ScatterND", [ins[0], b.initializer(indices.astype(np.int64)), ins[1]], outs)


def _tril(node, ins, outs, b):
    """Where(the lower triangle, x, fill_value): the triangle a constant of the last two axes
    (shapes are static), as ``numpy.tril``'s ``k``; ONNX's Trilu fills zeros only."""
    x = node.inputs[0]
    rows, cols = x.shape[-2:]
    mask = b.initializer(np.tril(np.ones((rows, cols), bool), node.attrs["diagonal"]))
    fill = b.initializer(np.asarray(node.attrs["fill_value"], x.dtype.np))
    b.node("Where", [mask, ins[0], fill], outs)


def _masked_fill(node, ins, outs, b):
    """Where(mask != 0, value, x): miniflow's int64 mask (its bool stand-in) compared to 0, both
    broadcast as NumPy's (an attention mask given as data is a constant of the graph)."""
    zero = b.initializer(np.zeros((), np.int64))
    where = b.node("Not", b.node("Equal", [ins[1], zero], 1), 1)
    fill = b.initializer(np.asarray(node.attrs["value"], node.inputs[0].dtype.np))
    b.node("Where", where + [fill, ins[0]], outs)


def _reduce_max(node, ins, outs, b):
    """ReduceMax over the node's one axis: an attribute up to opset 17, an input from 18."""
    a = node.attrs
    if b.opset >= 18:
        b.node("ReduceMax", [ins[0], b.ints([a["axis"]])], outs, keepdims=int(a["keepdims"]))
    else:
        b.node("ReduceMax", ins, outs, axes=[a["axis"]], keepdims=int(a["keepdims"]))


def _top_k(node, ins, outs, b):
    """TopK along the last axis, sorted; its Values output unused (``Tensor.topk`` gathers
    them). ONNX leaves the order of equal elements and of NaN to the runtime."""
    b.node("TopK", [ins[0], b.ints([node.attrs["k"]])], [b.fresh("topk_values"), outs[0]],
           axis=-1, largest=int(node.attrs["largest"]), sorted=1)


def _cumprod(node, ins, outs, b):
    """Refused: ONNX has no cumulative product (CumSum only)."""
    raise NoStandardForm("ONNX has no cumulative-product operator (only CumSum): export a "
                         "model without cumprod, or the stage with after=... (the ai.miniflow "
                         "domain)")


def _cumsum(node, ins, outs, b):
    """CumSum along ``dim`` (``cumsum_grad``: ``reverse=1``), the axis an int64 constant."""
    b.node("CumSum", [ins[0], b.initializer(np.array(node.attrs["dim"], np.int64))], outs,
           reverse=int(node.op.name == "cumsum_grad"))


def _scatter_elements(node, ins, outs, b):
    """ScatterElements(input, index, src) with axis = dim (``torch.scatter`` / ``scatter_add``'s
    export): reduction "add" for ``dim_scatter_add`` (an attribute from opset 16), none for the
    updates; the scalar update's src is a constant of index's shape. ONNX leaves repeated places
    of a write undefined (miniflow writes the last)."""
    add = node.op.name == "dim_scatter_add"
    if add and b.opset < 16:
        raise NoStandardForm(f"ONNX's ScatterElements adds (reduction 'add') from opset 16, this "
                             f"export asked for opset {b.opset} (export with opset=16 or later)")
    if node.op.name == "dim_scatter_update_scalar":
        x, idx = node.inputs
        ins = [*ins, b.initializer(np.full(idx.shape, node.attrs["src_scalar"], x.dtype.np))]
    reduction = {"reduction": "add" if add else "none"} if b.opset >= 16 else {}
    b.node("ScatterElements", ins, outs, axis=node.attrs["dim"], **reduction)


CONVERTERS = {
    "fused_elementwise": _fused,
    "detach": lambda n, ins, outs, b: b.node("Identity", ins, outs),
    "reduce_max": _reduce_max,
    "argmax": lambda n, ins, outs, b: b.node("ArgMax", ins, outs, axis=n.attrs["axis"],
                                             keepdims=int(n.attrs["keepdims"])),
    "matmul": _matmul,
    "bias_add": _bias_add,
    "conv2d": _conv2d,
    "normalization": _normalization,
    "max_pool_2d": _max_pool,
    "avg_pool_2d": _avg_pool,
    "adaptive_avg_pool2d": _adaptive_avg_pool,
    "flatten": _flatten,
    "reshape": lambda n, ins, outs, b: b.node("Reshape", [ins[0], b.ints(n.attrs["shape"])],
                                              outs),
    "transpose": lambda n, ins, outs, b: b.node("Transpose", ins, outs,
                                                perm=list(n.attrs["perm"])),
    "reduce_sum": _reduce_sum,
    "broadcast_like": lambda n, ins, outs, b: _broadcast_like(n, ins[:1], outs, b),
    "expand": lambda n, ins, outs, b: b.node("Expand", [ins[0], b.ints(n.attrs["expand_shape"])],
                                             outs),
    "add_n": lambda n, ins, outs, b: b.node("Sum", ins, outs),
    "softmax": lambda n, ins, outs, b: b.node("Softmax", ins, outs, axis=-1),
    "log_softmax": lambda n, ins, outs, b: b.node("LogSoftmax", ins, outs, axis=-1),
    "cast": lambda n, ins, outs, b: b.node("Cast", ins, outs,
                                           to=tensor_type(b.onnx, n.attrs["dtype"])),
    "cast_like": lambda n, ins, outs, b: b.node("CastLike", ins, outs),
    "ones_like": lambda n, ins, outs, b: _constant_of_shape(
        b, b.node("Shape", ins, 1)[0], outs[0], 1, n.outputs[0].dtype),
    "constant": lambda n, ins, outs, b: _constant_of_shape(
        b, b.ints(n.attrs["shape"]), outs[0], n.attrs["value"], n.attrs["dtype"]),
    "sparse_softmax_cross_entropy": _sce,
    "batch_matmul": _batch_matmul,
    "slice": _slice,
    "slice_update": _slice_update,
    "tril": _tril,
    "masked_fill": _masked_fill,
    "gather": lambda n, ins, outs, b: b.node("Gather", ins, outs, axis=n.attrs["axis"]),
    "dim_gather": lambda n, ins, outs, b: b.node("GatherElements", ins, outs,
                                                 axis=n.attrs["dim"]),
    "top_k": _top_k, "cumsum": _cumsum, "cumsum_grad": _cumsum, "cumprod": _cumprod,
    "cumprod_grad": _cumprod,
    "dim_scatter_update": _scatter_elements,
    "dim_scatter_update_scalar": _scatter_elements,
    "dim_scatter_add": _scatter_elements,
    "cat": lambda n, ins, outs, b: b.node("Concat", ins, outs, axis=n.attrs["axis"]),
}
"""Op type -> ``convert(node, input names, output names, builder)``; elementwise ops go by their
scalar function (:data:`FUNCTIONS`), ``max_pool_2d`` and ``layer_norm`` by
:func:`standard_form` itself (they need the Values that later nodes or results read)."""


def standard_form(node, ins: list, outs: list, b: Builder, used: set) -> None:
    """Emit ``node``'s standard ONNX form into ``b``.

    Raises:
        NoStandardForm: the op, or this node of it, has none (nothing is emitted).
    """
    if node.written:
        raise NoStandardForm("it writes variables in place (a training step's update, the "
                             "scratch statistics of a BatchNorm without running statistics, or "
                             "a module left in training mode: a dropout's random state; call "
                             ".eval() on the model before building an inference graph)")
    if node.op.name == "max_pool_2d":
        return _max_pool(node, ins, outs, b, used)
    if node.op.name == "layer_norm":
        return _layer_norm(node, ins, outs, b, used)
    convert = CONVERTERS.get(node.op.name)
    if convert is not None:
        return convert(node, ins, outs, b)
    if node.op.scalar is not None:
        return _elementwise(node, ins, outs, b)
    raise NoStandardForm("miniflow has no converter to ONNX operators for this op yet "
                         "(miniflow/onnx/convert.py: CONVERTERS)")
