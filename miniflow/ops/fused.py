"""``fused_elementwise``: a chain of elementwise ops (casts included) as one node, made by the
``fuse_elementwise`` pass after AMP and the optimizer pass; it has no gradient rule.

``y0[, y1 ...] = fused_elementwise(x0, x1, ...) {expr=...}`` evaluates ``expr`` at every element of
the output shape, each input broadcast to it (NumPy rules). It prints as, for example::

    %9: f16[64,128] = fused_elementwise(%3, %4) {expr='relu(add(x0, x1))'}

The expression language is a small subset of Python syntax (parsed with ``ast``):

* ``x0``, ``x1`` ...: the node's inputs, in order;
* numbers (``0.015625``, ``-2.5``, ``inf``, ``nan``): scalar attributes; a number takes the compute
  type of the other operands (float32 for f16 and f32), as ``scalar_mul``'s ``scalar`` does;
* ``fn(a, ...)``: the scalar function of a registered elementwise op, by its name (``add``,
  ``relu``, ``relu_grad`` ...: ``registry.scalar_functions``, so a newly declared op is known
  here at once) on operands of one float dtype, which is also the result's dtype;
* ``f16(a)``, ``bf16(a)``, ``f32(a)``, ``f64(a)``: a cast (from any dtype, int64 included);
* statements ``t0 = ...; y0 = ...; y1 = ...`` when there are several outputs or a value is used
  twice: ``y`` names are the outputs in order, ``t`` names temporaries. A bare expression is the
  single output ``y0``.

Every function and cast result is rounded to its dtype (half results to float16 or bfloat16) exactly where
the unfused graph stored it, so a fused graph computes the same bits as the unfused one. The
float64 reference (:func:`reference`) computes each function with the reference of an op that
declares it, rounding only at casts, as ``miniflow.ir.evaluate`` does for the unfused nodes.

Broadcasting is limited to what kernels index without a stride table: after merging dims that every
input treats alike, at most two dims ``(rows, cols)`` remain and each input is ``"full"``, a
``"row"`` (varies along cols), a ``"col"`` (varies along rows) or a ``"scalar"``
(:func:`broadcast_kinds`).

Source: XLA's loop fusion and TVM's injective fusion (one kernel per chain of elementwise ops);
OneFlow fuses the same chains by hand (``fused_bias_add_gelu``, ``fused_scale_mask_softmax``).
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass

import numpy as np

from ..dtype import bfloat16, float16, float32, float64
from .common import float_samples, fmt, rand, rounded
from .registry import CAST_FUNCTIONS, register, scalar_functions, scalar_ops

__all__ = ["Program", "parse", "format_program", "term_dtype", "broadcast_kinds", "CASTS",
           "arity", "reference"]

CASTS = dict(zip(CAST_FUNCTIONS, (float16, bfloat16, float32, float64)))
"""Cast function name -> result dtype."""


def arity() -> dict:
    """Function (scalar function of a registered op, or cast) -> number of operands."""
    return {**{name: fn.__code__.co_argcount for name, fn in scalar_functions().items()},
            **dict.fromkeys(CASTS, 1)}


@dataclass(frozen=True)
class Program:
    """A parsed expression: ``statements`` is a tuple of ``(name, term)``; a term is ``("x", k)``,
    ``("num", float)``, ``("ref", name)`` or ``("call", fn, (terms...))``. ``outputs`` are the
    ``y`` names in order."""

    statements: tuple
    outputs: tuple

    @property
    def num_inputs(self) -> int:
        """1 + the largest input index used."""
        return 1 + max((t[1] for t in self.terms() if t[0] == "x"), default=-1)

    def terms(self):
        """Every term of every statement, parents before children."""
        stack = [term for _, term in reversed(self.statements)]
        while stack:
            t = stack.pop()
            yield t
            if t[0] == "call":
                stack.extend(reversed(t[2]))

    def dtypes(self, input_dtypes) -> dict:
        """Name -> DType of every statement, given the inputs' DTypes.

        Raises:
            TypeError: an operand of the wrong dtype (naming the function).
        """
        named: dict = {}
        for name, term in self.statements:
            named[name] = term_dtype(term, input_dtypes, named)
            if named[name] is None:
                raise TypeError(f"fused_elementwise: {name} is a bare number; numbers must be "
                                f"operands of a function")
        return named


def term_dtype(term, input_dtypes, named: dict):
    """The DType of ``term`` (None for a number), given the inputs' DTypes and ``named``: the
    DTypes of the statements before it.

    Raises:
        TypeError: an operand of the wrong dtype (naming the function).
    """
    kind = term[0]
    if kind == "x":
        return input_dtypes[term[1]]
    if kind == "ref":
        return named[term[1]]
    if kind == "num":
        return None
    fn, args = term[1], term[2]
    arg_types = [term_dtype(a, input_dtypes, named) for a in args]
    if fn in CASTS:
        return CASTS[fn]
    found = {t for t in arg_types if t is not None}
    if len(found) != 1 or not next(iter(found)).is_float:
        raise TypeError(f"fused_elementwise: {fn} needs operands of one float dtype, got "
                        + ", ".join("number" if t is None else t.short for t in arg_types))
    return found.pop()


# ------------------------------------------------------------------------------ text <-> Program
def _number_text(v: float) -> str:
    """A number as the expression language writes it (shortest round-trip repr; inf, nan)."""
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


def _term_text(term) -> str:
    kind = term[0]
    if kind == "x":
        return f"x{term[1]}"
    if kind == "num":
        return _number_text(term[1])
    if kind == "ref":
        return term[1]
    return f"{term[1]}({', '.join(_term_text(a) for a in term[2])})"


def format_program(statements) -> str:
    """The ``expr`` text of ``[(name, term), ...]``: a bare expression for one output ``y0``."""
    if len(statements) == 1 and statements[0][0] == "y0":
        return _term_text(statements[0][1])
    return "; ".join(f"{name} = {_term_text(term)}" for name, term in statements)


def _bad(expr: str, why: str):
    return ValueError(f"fused_elementwise: bad expr {expr!r}: {why}")


def _parse_term(node, expr: str, defined: set):
    if isinstance(node, ast.Name):
        name = node.id
        if name in ("inf", "nan"):
            return ("num", float(name))
        if name[0] == "x" and name[1:].isdigit():
            return ("x", int(name[1:]))
        if name in defined:
            return ("ref", name)
        raise _bad(expr, f"unknown name {name!r}")
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return ("num", float(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _parse_term(node.operand, expr, defined)
        if inner[0] == "num":
            return ("num", -inner[1])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn, known = node.func.id, arity()
        if fn not in known:
            raise _bad(expr, f"unknown function {fn!r}; known: {', '.join(sorted(known))}")
        if len(node.args) != known[fn]:
            raise _bad(expr, f"{fn} takes {known[fn]} operand(s), got {len(node.args)}")
        return ("call", fn, tuple(_parse_term(a, expr, defined) for a in node.args))
    raise _bad(expr, f"unsupported syntax {ast.dump(node)}")


def _parse_uncached(expr: str) -> Program:
    try:
        body = ast.parse(expr).body
    except SyntaxError as e:
        raise _bad(expr, str(e)) from None
    if len(body) == 1 and isinstance(body[0], ast.Expr):
        return Program((("y0", _parse_term(body[0].value, expr, set())),), ("y0",))
    statements, defined = [], set()
    for stmt in body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            raise _bad(expr, "expected `name = expression` statements")
        name = stmt.targets[0].id
        if name[0] not in "ty" or not name[1:].isdigit() or name in defined:
            raise _bad(expr, f"statement names are t0, t1 ... and y0, y1 ..., each once; "
                             f"got {name!r}")
        statements.append((name, _parse_term(stmt.value, expr, defined)))
        defined.add(name)
    outputs = tuple(name for name, _ in statements if name[0] == "y")
    if outputs != tuple(f"y{k}" for k in range(len(outputs))) or not outputs:
        raise _bad(expr, "outputs must be y0, y1 ... in order")
    return Program(tuple(statements), outputs)


_PARSED: dict = {}


def parse(expr: str) -> Program:
    """Parse ``expr`` (memoised; plans of many shapes share one expression).

    Raises:
        ValueError: a syntax error, an unknown name or function, misnamed statements.
    """
    if expr not in _PARSED:
        _PARSED[expr] = _parse_uncached(expr)
    return _PARSED[expr]


# ------------------------------------------------------------------------------ broadcasting
def broadcast_kinds(out_shape, in_shapes):
    """How each input broadcasts to ``out_shape``, or None when a kernel cannot index it simply.

    Dims of size 1 are dropped and adjacent dims merged where every input is either full or
    broadcast in both. Returns ``(dims, kinds)``: ``dims`` is ``(n,)`` (one merged dim, or none:
    ``(1,)``) or ``(rows, cols)``; ``kinds`` has one of ``"full"``, ``"row"``, ``"col"``,
    ``"scalar"`` per input (only ``"full"`` / ``"scalar"`` with one dim).
    """
    out_shape = tuple(out_shape)
    padded = [(1,) * (len(out_shape) - len(s)) + tuple(s) for s in in_shapes]
    dims, pattern = [], []                    # pattern[d][k]: input k is full along merged dim d
    for d, n in enumerate(out_shape):
        if n == 1:
            continue
        full = tuple(s[d] != 1 for s in padded)
        if pattern and pattern[-1] == full:
            dims[-1] *= n
        else:
            dims.append(n)
            pattern.append(full)
    if len(dims) > 2:
        return None
    if len(dims) < 2:
        full = pattern[0] if pattern else (True,) * len(padded)
        return (dims[0] if dims else 1,), ["full" if f else "scalar" for f in full]
    names = {(True, True): "full", (False, True): "row", (True, False): "col",
             (False, False): "scalar"}
    return tuple(dims), [names[(a, b)] for a, b in zip(*pattern)]


# ------------------------------------------------------------------------------ reference
def _call(fn: str, operands: list):
    """Function ``fn`` on float64 operands through the reference of an op declaring it: tensor
    operands as its inputs, the last ones as its scalar attributes (``scalar_attrs``)."""
    op = scalar_ops()[fn]
    k = op.tensor_arity
    return op.reference(operands[:k], dict(zip(op.scalar_attrs, operands[k:])))[0]


def reference(arrays, attrs) -> list:
    """``fused_elementwise`` in NumPy float64: the expression evaluated on whole arrays, inputs
    broadcast; casts round to their dtype (``f16(...)`` to float16 values), functions do not."""
    program = parse(attrs["expr"])
    named: dict = {}

    def value(term):
        kind = term[0]
        if kind == "x":
            return arrays[term[1]]
        if kind == "num":
            return np.float64(term[1])
        if kind == "ref":
            return named[term[1]]
        operands = [value(a) for a in term[2]]
        if term[1] in CASTS:
            return rounded(operands[0], CASTS[term[1]])
        return _call(term[1], operands)

    for name, term in program.statements:
        named[name] = value(term)
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    return [np.broadcast_to(np.asarray(named[y], np.float64), shape).copy()
            for y in program.outputs]


# ------------------------------------------------------------------------------ the op
def _normalize(inputs, attrs):
    if "expr" not in attrs:
        raise ValueError("fused_elementwise: missing attribute 'expr'")
    return {"expr": str(attrs["expr"])}


def _infer(inputs, attrs):
    program = parse(attrs["expr"])
    if program.num_inputs != len(inputs) or not inputs:
        raise ValueError(f"fused_elementwise: expr {attrs['expr']!r} reads "
                         f"{program.num_inputs} input(s), the node has {len(inputs)}")
    try:
        shape = tuple(np.broadcast_shapes(*(v.shape for v in inputs)))
    except ValueError:
        raise ValueError("fused_elementwise: inputs cannot be broadcast together: "
                         + ", ".join(fmt(v) for v in inputs)) from None
    if 0 not in shape and broadcast_kinds(shape, [v.shape for v in inputs]) is None:
        raise ValueError("fused_elementwise: inputs broadcast in more than two merged dims: "
                         + ", ".join(fmt(v) for v in inputs))
    dtypes = program.dtypes([v.dtype for v in inputs])
    return [(shape, dtypes[name]) for name in program.outputs]


def _samples():
    def make(dt):
        r = np.random.default_rng(13)
        special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 6e4], dt)
        return [([rand(5, 7, dtype=dt, r=r), rand(7, dtype=dt, r=r)],
                 {"expr": "relu(add(x0, x1))"}),
                ([rand(4, 3, dtype=dt, r=r), rand(4, 1, dtype=dt, r=r, lo=0.5)],
                 {"expr": "t0 = div(x0, x1); y0 = mul(t0, 0.5); y1 = tanh_grad(t0, x0)"}),
                ([special, special[::-1].copy()], {"expr": "sub(exp(x0), mul(x1, 2.5))"}),
                ([rand(0, 3, dtype=dt, r=r)], {"expr": "neg(x0)"})]
    casts = [([rand(6, 5, lo=-7e4, hi=7e4), rand(5)], {"expr": "f16(add(x0, x1))"}),
             ([rand(3, 4, dtype=np.float16), rand(3, 4)],
              {"expr": "t0 = f32(x0); y0 = f16(mul(t0, x1)); y1 = sigmoid(t0)"})]
    return float_samples(make) + casts


register("fused_elementwise", _infer, normalize=_normalize, samples=_samples, reference=reference,
         amp=None, amp_note="made by the fusion pass after AMP from already colored nodes; its "
                            "expr keeps their dtypes and casts",
         doc="outputs = expr evaluated per element, inputs broadcast (made by fuse_elementwise)")

