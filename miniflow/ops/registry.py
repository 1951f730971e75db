"""The op registry: one :class:`OpDef` record per op type, everything about the op in one place.

An op type is declared once: attribute normalisation, shape/dtype inference, its gradient rule
(which *emits* backward nodes made of registered ops, OneFlow style), sample inputs, a NumPy float64
reference, its AMP category (and the inputs AMP never casts), which inputs it writes in place (for
every node, or depending on its attributes), and, for an elementwise op, its scalar function.
Everything else is derived from these records: the CPU and CUDA elementwise kernels
(``miniflow.kernels.common.elementwise``), the fusion pass's fusible ops and the function table of
the fused-expression language (:func:`scalar_functions`), the AMP default lists
(``miniflow.amp.lists``), dead-code elimination's "keep it" (:meth:`OpDef.written`, read through
``Node.written``), the reference interpreter ``miniflow.ir.evaluate`` and the registry-wide kernel
tests. Kernels register per backend under the op's name (``miniflow.kernels.cpu.KERNELS``), or are
derived from the scalar function when a plan is built (``builder_for``).

A node of the IR holds its ``OpDef`` (``node.op``), so ``miniflow.ir`` never imports this package.
Code that names ops by string resolves them here: :func:`get_op`, and :func:`emitter`, the
``emit(name, *inputs, **attrs)`` that gradient rules and passes use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["OpDef", "register", "unregister", "get_op", "all_ops", "OP_REGISTRY", "inference_calls",
           "emitter", "scalar_functions", "scalar_ops", "AMP_CATEGORIES", "CAST_FUNCTIONS"]

OP_REGISTRY: dict[str, "OpDef"] = {}

AMP_CATEGORIES = ("white", "black", "gray", "clear")
"""The AMP lists an op can be in (``OpDef.amp``; None: in no list, "unlisted")."""

CAST_FUNCTIONS = ("f16", "bf16", "f32", "f64")
"""Names the fused-expression language reserves for casts: no scalar function may take them."""

_INFER_CALLS = [0]


def inference_calls() -> int:
    """Total number of shape/dtype inference calls made so far (the hot-path test reads it)."""
    return _INFER_CALLS[0]


@dataclass(eq=False)
class OpDef:
    """Definition of one op type.

    Attributes:
        name: OneFlow op type name (``"matmul"``, ``"bias_add"`` ...).
        infer_fn: ``(inputs: list[Value], attrs) -> list[(shape, DType)]``; raises
            ValueError/TypeError naming the op and the offending shapes/dtypes.
        grad: ``(node, out_grads, emit) -> list[Value | None]`` (one entry per input), or None when
            the op is not differentiable. ``emit(name, *inputs, **attrs)`` (:func:`emitter`).
        normalize: ``(inputs, attrs) -> attrs`` filling defaults and canonicalising attributes.
        reference: ``(arrays, attrs) -> list[np.ndarray]``: the op in NumPy float64 (int64 stays
            int64), one array per output, then, for an op that writes inputs (:meth:`written`),
            their new values in that order (those of its inputs that exist). Used by
            ``miniflow.ir.evaluate``. Only ``cast`` and ``constant`` round, to their dtype, and
            ``evaluate`` rounds the outputs of an op with ``round_outputs``.
        samples: ``() -> list[(list[np.ndarray], attrs)]`` small example inputs for kernel tests.
        amp: the op's AMP list, ``"white"``, ``"black"``, ``"gray"`` or ``"clear"`` (OneFlow's
            lists, ``miniflow.amp.lists``), or None: in no list.
        amp_note: why the op is in no list (required then), or a remark on its list.
        no_cast_inputs: input index -> input name of the inputs the AMP pass never casts, even
            when the node runs in float16 (OneFlow's ``REGISTER_NO_CAST_REGISTRY``: batch norm's
            statistics and affine parameters stay float32 while ``x`` is float16).
        writes: indices of the inputs the op writes in place (update ops), or a function
            ``(attrs, number of inputs) -> indices`` when that depends on the node
            (``normalization`` writes its moving statistics only in training mode; the
            multi-tensor updates write a number of inputs that depends on how many tensors
            they update). Read it through :meth:`written`.
        scalar: for an elementwise op, its scalar function: a plain Python function of floats
            (``math`` only), ``out[idx] = scalar(in0[idx], in1[idx], *scalar_args(attrs))``
            with the inputs broadcast to the output (NumPy rules). The CPU and CUDA kernels and the
            fused kernels are compiled from it. Ops that compute elementwise but not in this form
            (``bias_add``, ``add_n``, ``cast``) leave it None and have their own kernel rules.
        scalar_attrs: the attributes passed as the scalar function's last operands, in order
            (``("scalar",)`` for ``scalar_add``, ``("beta", "threshold")`` for ``softplus``);
            only with one tensor operand. Read them through :meth:`scalar_args`.
        scalar_defaults: attribute name -> the value a node that omits it gets (``{"beta":
            1.0}``); an attribute of ``scalar_attrs`` without one must be given.
        diagnose: ``(node, host input arrays) -> str | None``: when the op's kernel raised, a
            sentence about the offending values (e.g. which label is out of range) that the
            executor appends to the error.
        micro_batch: for the boundary ops of gradient accumulation (``miniflow.ops.accumulation``),
            ``(kind, count attribute)``: kind ``"split"`` (its output is one micro-batch of its
            input) or ``"collect"`` (its input is one micro-batch's, its output is complete after
            the last one; its reference receives the output so far as an extra last array after
            the first micro-batch), and the attribute holding the number of micro-batches; None
            for every other op. Such an op runs once per micro-batch with ``attrs["micro_batch"]``
            set to the micro-batch's index (``miniflow.ir.Graph.micro_batch_schedule``).
        shape_inputs: indices of the inputs read for their shape or dtype only (``ones_like``'s
            x, ``broadcast_like``'s like, ``cast_like``'s dtype_like): a node whose other inputs
            are all constants (``constant`` has none) computes a constant, which a plan computes
            once, at its first run (``runtime.plan.constant_nodes``); the fusion pass does not
            make a fused group read them.
        round_outputs: whether ``ir.evaluate`` rounds the reference's outputs to the dtypes
            of the node's outputs, as the kernel stores them: for an op whose rounding its
            reference cannot see (``cast_like``: its dtype is ``dtype_like``'s, and the
            reference gets float64 arrays).
        doc: one line: what the op computes.
    """

    name: str
    infer_fn: Callable
    grad: Callable | None = None
    normalize: Callable | None = None
    reference: Callable | None = None
    samples: Callable | None = None
    amp: str | None = None
    amp_note: str = ""
    no_cast_inputs: dict = field(default_factory=dict)
    writes: tuple | Callable = ()
    scalar: Callable | None = None
    scalar_attrs: tuple = ()
    scalar_defaults: dict = field(default_factory=dict)
    diagnose: Callable | None = None
    micro_batch: tuple | None = None
    shape_inputs: tuple = ()
    round_outputs: bool = False
    doc: str = field(default="", repr=False)

    def written(self, attrs, n_inputs: int) -> tuple:
        """Indices (ascending) of the inputs a node of this op with (normalized) ``attrs`` and
        ``n_inputs`` inputs writes in place: the one accessor of ``writes`` (``Node.written``
        calls it; dead-code elimination keeps such nodes, ``ir.evaluate`` assigns the new
        values, fusion keeps reads before writes)."""
        if callable(self.writes):
            return tuple(self.writes(attrs, n_inputs))
        return tuple(k for k in self.writes if k < n_inputs)

    def infer(self, inputs, attrs):
        """Shape/dtype inference (counted, so tests can prove the hot path never calls it)."""
        _INFER_CALLS[0] += 1
        return self.infer_fn(inputs, attrs)

    def normalize_attrs(self, inputs, attrs):
        """Canonical attributes for ``inputs`` (defaults filled, axes made non-negative): the
        scalar attributes first, as floats in declaration order (:meth:`scalar_args`), then the
        others, through ``normalize``."""
        attrs = dict(attrs)
        if self.scalar_attrs:
            rest = {k: v for k, v in attrs.items() if k not in self.scalar_attrs}
            attrs = {**{a: float(v) for a, v in zip(self.scalar_attrs, self.scalar_args(attrs))},
                     **rest}
        return self.normalize(inputs, attrs) if self.normalize else attrs

    def scalar_args(self, attrs) -> tuple:
        """The values of the scalar attributes in ``attrs``, in ``scalar_attrs`` order, defaults
        filled (floats on a node: :meth:`normalize_attrs` converts them; the fused-expression
        reference passes arrays): the scalar function's operands after the tensors, the one
        accessor of ``scalar_attrs`` for kernels, fusion, the reference and the ONNX export;
        ``()`` for an op without them.

        Raises:
            ValueError: an attribute without a default is missing."""
        missing = [a for a in self.scalar_attrs if a not in attrs and a not in self.scalar_defaults]
        if missing:
            raise ValueError(f"{self.name}: missing attribute {missing[0]!r} (it has no default)")
        return tuple(attrs[a] if a in attrs else self.scalar_defaults[a] for a in self.scalar_attrs)

    @property
    def tensor_arity(self) -> int:
        """Number of tensor inputs of an elementwise op: its scalar function's operands, less the
        scalar attributes."""
        return self.scalar.__code__.co_argcount - len(self.scalar_attrs)

    def __repr__(self) -> str:
        return f"OpDef({self.name!r})"


def _check(op: OpDef) -> None:
    """The declaration's own consistency (raised at import, naming the op)."""
    if op.amp is not None and op.amp not in AMP_CATEGORIES:
        raise ValueError(f"op {op.name!r}: amp={op.amp!r}; choose one of "
                         f"{', '.join(AMP_CATEGORIES)} or None (unlisted, with amp_note)")
    if op.amp is None and not op.amp_note:
        raise ValueError(f"op {op.name!r} is in no AMP list: say why in amp_note")
    if op.micro_batch is not None and (len(op.micro_batch) != 2
                                       or op.micro_batch[0] not in ("split", "collect")):
        raise ValueError(f"op {op.name!r}: micro_batch={op.micro_batch!r}; give ('split' or "
                         "'collect', the attribute holding the count), or None")
    if not all(isinstance(k, int) and isinstance(v, str) for k, v in op.no_cast_inputs.items()):
        raise ValueError(f"op {op.name!r}: no_cast_inputs must map input indices to input names, "
                         f"got {op.no_cast_inputs!r}")
    _check_scalar_attrs(op)
    if op.scalar is None:
        return
    fn_name = op.scalar.__name__
    if fn_name in CAST_FUNCTIONS:
        raise ValueError(f"op {op.name!r}: scalar function name {fn_name!r} is reserved for a cast")
    known = scalar_functions().get(fn_name)
    if known is not None and known is not op.scalar:
        raise ValueError(f"op {op.name!r}: scalar function {fn_name!r} "
                         f"({op.scalar.__module__}) clashes with another function of that name "
                         f"({known.__module__}); give it another name")
    if op.tensor_arity not in (1, 2):
        raise ValueError(f"op {op.name!r}: elementwise kernels take one or two tensors; "
                         f"{fn_name} has {op.tensor_arity} tensor operand(s)")
    if op.scalar_attrs and op.tensor_arity != 1:
        raise ValueError(
            f"op {op.name!r}: scalar attributes {op.scalar_attrs} need one tensor operand; "
            f"{fn_name} has {op.tensor_arity}. Only the map kernels take scalar operands: the "
            "CPU and CUDA broadcasting zip kernels (flat and strided, which bias_add, add_n and "
            "every broadcast_* op share) take none. Write a gradient op(x, dy) with attributes "
            "as a one-input derivative op with them, times dy (broadcast_mul); fusion makes the "
            "two one kernel (softplus_derivative)")


def _check_scalar_attrs(op: OpDef) -> None:
    """``scalar_attrs`` and ``scalar_defaults`` against each other and the scalar function."""
    attrs = op.scalar_attrs
    if attrs and op.scalar is None:
        raise ValueError(f"op {op.name!r}: scalar_attrs without a scalar function")
    if not isinstance(attrs, tuple) or not all(isinstance(a, str) for a in attrs) \
            or len(set(attrs)) != len(attrs):
        raise ValueError(f"op {op.name!r}: scalar_attrs must be a tuple of distinct attribute "
                         f"names, got {attrs!r}")
    extra = sorted(set(op.scalar_defaults) - set(attrs))
    if extra:
        raise ValueError(f"op {op.name!r}: defaults for {extra}, which are not in scalar_attrs "
                         f"{attrs}")


def register(name: str, infer, **kw) -> OpDef:
    """Register an op type; returns its OpDef.

    Raises:
        KeyError: the name is already registered.
        ValueError: an inconsistent declaration (unknown AMP list, unlisted without a note, a
            scalar function whose name another function already has, or of an arity no
            elementwise kernel takes).
    """
    if name in OP_REGISTRY:
        raise KeyError(f"op type {name!r} is already registered")
    op = OpDef(name, infer, **kw)
    _check(op)
    OP_REGISTRY[name] = op
    return op


def unregister(name: str) -> OpDef:
    """Remove op type ``name`` (a throwaway op of a test or a tutorial); returns its OpDef. Nothing
    else holds a registered op: kernels of elementwise ops are derived when a plan is built, so
    the name, and its scalar function's name, can be registered again.

    Raises:
        KeyError: unknown op type, listing the registered ones.
    """
    op = get_op(name)
    del OP_REGISTRY[name]
    return op


def get_op(name: str) -> OpDef:
    """The OpDef of op type ``name``.

    Raises:
        KeyError: unknown op type, listing the registered ones.
    """
    try:
        return OP_REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op type {name!r}; registered: {', '.join(sorted(OP_REGISTRY))}") from None


def all_ops() -> dict:
    """All registered op types, name -> OpDef."""
    return dict(OP_REGISTRY)


def emitter(graph):
    """``emit(name, *inputs, **attrs)``: append a node of the op type ``name`` to ``graph``
    (``graph.emit(get_op(name), ...)``, at its insertion point); returns its output Value(s).

    This is the ``emit`` that gradient rules receive and that passes use."""
    def emit(name: str, *inputs, **attrs):
        return graph.emit(get_op(name), *inputs, **attrs)
    return emit


def scalar_ops() -> dict:
    """Scalar function name -> the first registered op that declares it. Every op declaring one
    function computes ``out = fn(*inputs broadcast, *op.scalar_args(attrs))``, so any of them can
    stand for the function (the fused-expression reference uses its ``reference``)."""
    out: dict = {}
    for op in OP_REGISTRY.values():
        if op.scalar is not None:
            out.setdefault(op.scalar.__name__, op)
    return out


def scalar_functions() -> dict:
    """Function name -> scalar function, over every registered elementwise op: the functions of
    the fused-expression language (``miniflow.ops.fused``). Names are unique (:func:`register`
    checks), so the name of a function identifies it in an expression and in generated code."""
    return {name: op.scalar for name, op in scalar_ops().items()}
