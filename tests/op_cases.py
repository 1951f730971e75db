"""Kernel cases of every registered op, shared by the registry-wide test (``test_registry.py``: the
CPU kernels against ``ir.evaluate``) and the CUDA lanes (``cuda_cases``): every registered sample,
a float64 variant of each, and every cast between the dtypes; how to build one node of a case, run
it on host buffers, and what the float64 reference (``miniflow.ir.evaluate`` of a one-node graph)
says it must give. Also :func:`late_op`, an elementwise op registered by a test, after the kernel
packages were imported.

A new op is covered as soon as it registers ``samples`` (and a ``reference``, or it fails).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from unittest import mock

import numpy as np

from miniflow.dtype import as_dtype, bfloat16
from miniflow.ir import Graph, Node, Value, evaluate
from miniflow.ops import all_ops, get_op, unregister

__all__ = ["SENTINEL", "Case", "registry_cases", "float64_cases", "bfloat16_cases", "cast_cases",
           "make_node",
           "host_buffers", "results", "run_cpu_placed", "reference", "TOL", "assert_bit_exact",
           "assert_close",
           "assert_matches_reference", "throwaway_cube", "late_op"]

SENTINEL = -777.0
"""Outputs start filled with this (exact in f16), so an element a kernel never writes shows."""


@dataclass
class Case:
    """One kernel run: op type, input arrays, attributes, and a label for the test id."""

    op: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    label: str = ""

    @property
    def id(self) -> str:
        dts = ",".join(as_dtype(a.dtype).short for a in self.inputs) or \
            as_dtype(self.attrs.get("dtype", "float32")).short
        return f"{self.op}[{self.label}:{dts}]"


def registry_cases() -> list:
    """Every registered sample of every op."""
    return [Case(name, list(ins), dict(attrs), f"s{k}")
            for name, opdef in sorted(all_ops().items())
            for k, (ins, attrs) in enumerate(opdef.samples() if opdef.samples else [])]


def _to_f64(a):
    return a.astype(np.float64) if a.dtype == np.float32 else a


def float64_cases() -> list:
    """Every sample with float32 inputs, widened to float64 (casts: ``cast_cases``)."""
    out = [Case("constant", [], {"value": 0.1, "shape": (2, 3), "dtype": "float64"}, "f64")]
    for name, opdef in sorted(all_ops().items()):
        if name in ("cast", "constant"):
            continue
        for k, (ins, attrs) in enumerate(opdef.samples() if opdef.samples else []):
            case = Case(name, [_to_f64(a) for a in ins], dict(attrs), f"s{k}-f64")
            if any(a.dtype == np.float32 for a in ins) and _accepts(case):
                out.append(case)
    return out


def bfloat16_cases() -> list:
    """Every sample with float16 inputs, as bfloat16 (every op that takes float16 takes bfloat16;
    casts: ``cast_cases``)."""
    out = []
    for name, opdef in sorted(all_ops().items()):
        if name in ("cast", "constant"):
            continue
        for k, (ins, attrs) in enumerate(opdef.samples() if opdef.samples else []):
            if any(a.dtype == np.float16 for a in ins):
                case = Case(name, [a.astype(bfloat16.np) if a.dtype == np.float16 else a
                                   for a in ins], dict(attrs), f"s{k}-bf16")
                out.append(case)
    return out + [Case("constant", [], {"value": 65536.0, "shape": (2, 3), "dtype": "bfloat16"},
                       "bf16")]


def _accepts(case) -> bool:
    """Whether the op's type checks accept the case (some ops are float32-only)."""
    try:
        make_node(case)
    except TypeError:
        return False
    return True


def cast_cases() -> list:
    """Every cast between f16, bf16, f32, f64 and i64 -> float, on values that probe every
    rounding case (fp16 overflow at 65520, bf16 overflow, subnormals of both, ties, inf, NaN,
    signed zero); and float -> i64 of integer values each float type holds exactly (the casts
    ``cross_entropy(ignore_index=)`` makes of its labels: -100 and the like, 2**40 in f32 and
    f64)."""
    r = np.random.default_rng(6)
    x = r.standard_normal(300) * np.exp2(r.uniform(-30, 20, 300))
    x = np.concatenate([x, [65504, 65519.99, 65520, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 1e6,
                            np.inf, -np.inf, np.nan, -np.nan, 0.0, -0.0, 1 + 2.0 ** -11,
                            1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -40,
                            3.3961776e38, 3.3961775e38, 2.0 ** -133, 2.0 ** -134, 1e-45]])
    ints = np.concatenate([np.arange(-300, 300), [2 ** 24 + 1, 65519, 65520, -(2 ** 40)]])
    cases = []
    for src in ("float16", "bfloat16", "float32", "float64", "int64"):
        with np.errstate(over="ignore", invalid="ignore"):
            xs = ints.astype(np.int64) if src == "int64" else x.astype(as_dtype(src).np)
        for dst in ("float16", "bfloat16", "float32", "float64"):
            cases.append(Case("cast", [xs], {"dtype": dst}, f"exact-to-{dst}"))
    whole = np.concatenate([np.arange(-256, 257), [-100, 0, 2 ** 10]])
    for src in ("float16", "bfloat16", "float32", "float64"):
        big = [2.0 ** 40, -(2.0 ** 40) - 8] if src in ("float32", "float64") else []
        xs = np.concatenate([whole, big]).astype(as_dtype(src).np)
        cases.append(Case("cast", [xs], {"dtype": "int64"}, f"whole-{src}-to-int64"))
    return cases


# ----------------------------------------------------------------------------- building
def make_node(case: Case) -> Node:
    """A Node for ``case`` with output Values from the op's own normalisation and inference.

    Inputs the node writes are declared as variables (update ops require that).
    """
    opdef = get_op(case.op)
    vals = [Value(f"in{i}", a.shape, as_dtype(a.dtype), kind="input")
            for i, a in enumerate(case.inputs)]
    attrs = opdef.normalize_attrs(vals, case.attrs)
    for k in opdef.written(attrs, len(vals)):
        vals[k].kind = "variable"
    node = Node(opdef, vals, [], attrs)
    node.outputs = [Value(f"out{i}", s, d, producer=node)
                    for i, (s, d) in enumerate(opdef.infer(vals, attrs))]
    return node


def host_buffers(case: Case, node: Node):
    """Fresh host copies of the inputs and sentinel-filled host outputs."""
    ins = [np.array(a, copy=True, order="C") for a in case.inputs]   # keeps 0-d arrays 0-d
    outs = [np.full(v.shape, SENTINEL, v.dtype.np) for v in node.outputs]
    return ins, outs


def results(case: Case, node: Node, ins, outs) -> list:
    """What a run produced: every output, then every input the node writes (``Node.written``)."""
    return list(outs) + [ins[k] for k in node.op.written(node.attrs, len(ins))]


def run_cpu(case: Case) -> list:
    """``case`` on the CPU kernels: its outputs, then the inputs it writes (:func:`results`)."""
    from miniflow.kernels import cpu
    node = make_node(case)
    ins, outs = host_buffers(case, node)
    for fn, args in cpu.builder_for(node.op)(node, ins, outs):
        fn(*args)
    return results(case, node, ins, outs)


class Arena:
    """Buffers carved one after another out of one allocation, each 16-byte aligned (as malloc's)
    and ``gaps[k]`` bytes (cyclically) past the end of the one before: where a kernel's buffers
    lie relative to each other, chosen by a test."""

    def __init__(self, nbytes: int, gaps: list):
        self.memory, self.gaps, self.at, self.count = np.zeros(nbytes, np.uint8), gaps, 0, 0

    def empty(self, shape, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
        at = self.at + self.gaps[self.count % len(self.gaps)]
        at += -(self.memory.ctypes.data + at) % 16
        size = int(np.prod(shape)) * dt.itemsize
        if at + size > self.memory.size:
            raise MemoryError(f"Arena: {size} bytes do not fit in {self.memory.size}")
        self.at, self.count = at + size, self.count + 1
        return self.memory[at:at + size].view(dt).reshape(shape)


def run_cpu_placed(case: Case, order, gaps) -> list:
    """``case`` on the CPU kernels as :func:`run_cpu`, with every buffer in one :class:`Arena`:
    the inputs and outputs (indices into inputs + outputs, in ``order``), then the scratch the
    builder allocates (``np.empty`` while the steps are built), ``gaps`` bytes apart."""
    from miniflow.kernels import cpu
    node = make_node(case)
    ins, outs = host_buffers(case, node)
    arrays = ins + outs
    arena = Arena(2 * sum(a.nbytes for a in arrays) + 64 * max(gaps) + (64 << 20), list(gaps))
    placed = list(arrays)
    for k in order:
        placed[k] = arena.empty(arrays[k].shape, arrays[k].dtype)
        placed[k][...] = arrays[k]
    ins, outs = placed[:len(ins)], placed[len(ins):]
    numpy_empty = np.empty

    def empty(shape, dtype=float, order="C", **kw):
        return (arena.empty(shape, dtype) if order == "C" and not kw
                else numpy_empty(shape, dtype, order, **kw))

    with mock.patch.object(np, "empty", empty):
        steps = cpu.builder_for(node.op)(node, ins, outs)
    with np.errstate(all="ignore"):
        for fn, args in steps:
            fn(*args)
    return [np.array(r) for r in results(case, node, ins, outs)]


def reference(case: Case) -> list:
    """What ``case`` must give, from the op's float64 reference: ``ir.evaluate`` of a one-node
    graph (inputs the op writes are variables), in the order of :func:`results`."""
    opdef = get_op(case.op)
    node = make_node(case)
    written = opdef.written(node.attrs, len(case.inputs))
    g = Graph()
    vals, inputs, variables = [], [], {}
    for i, a in enumerate(case.inputs):
        if i in written:
            vals.append(g.add_variable(f"in{i}", a.shape, as_dtype(a.dtype)))
            variables[f"in{i}"] = a
        else:
            vals.append(g.add_input(f"in{i}", a.shape, as_dtype(a.dtype)))
            inputs.append(a)
    outs = g.emit(opdef, *vals, **case.attrs)
    g.set_outputs([] if outs is None else list(outs) if isinstance(outs, tuple) else [outs])
    got = evaluate(g, inputs, variables)
    return ([got[f"output{k}"] for k in range(len(g.outputs))]
            + [got[f"in{i}"] for i in written])


TOL = {np.dtype(np.float16): (2e-3, 2e-3), bfloat16.np: (1.6e-2, 1.6e-2),
       np.dtype(np.float32): (2e-5, 2e-5),
       np.dtype(np.float64): (1e-12, 1e-12)}
"""Per result dtype, ``(rtol, atol)`` of a kernel against the float64 reference rounded to that
dtype (the kernels compute in float32 for f16/f32, and may round intermediate results)."""


def assert_bit_exact(got, want, what):
    """Same dtype, shape and bits; NaN only where ``want`` has NaN (payloads may differ)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    floating = want.dtype.kind == "f" or want.dtype == bfloat16.np
    nan = np.isnan(want) if floating else np.zeros(want.shape, bool)
    got_nan = np.isnan(got) if floating else nan
    assert np.array_equal(got_nan, nan), f"{what}: NaN positions"
    bits = f"u{want.dtype.itemsize}"
    bad = got[~nan].view(bits) != want[~nan].view(bits)
    assert not bad.any(), (f"{what}: {bad.sum()} elements differ, first: "
                           f"{got[~nan][bad][:3]} vs {want[~nan][bad][:3]}")


def assert_close(got, want, what, tol=TOL):
    """Same dtype and shape, values within ``tol`` of ``want``'s dtype (NaN where NaN); int64
    exactly (float64 would round beyond 2**53)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if want.dtype == np.int64:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    rtol, atol = tol[want.dtype]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=atol, equal_nan=True, err_msg=what)


def assert_matches_reference(case: Case, got: list) -> None:
    """``got`` (a kernel's :func:`results`) against :func:`reference`, each reference array rounded
    to the kernel's dtype: bit for bit for casts (NumPy's ``astype``), else at :data:`TOL`."""
    want = reference(case)
    assert len(got) == len(want), f"{case.id}: {len(got)} results, the reference has {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        with np.errstate(over="ignore", invalid="ignore"):
            w = w.astype(g.dtype)      # the value a tensor of the kernel's dtype holds
        what = f"{case.id} result {k} against the float64 reference"
        if case.op in ("cast", "cast_like"):
            assert_bit_exact(g, w, what)
        else:
            assert_close(g, w, what)


def throwaway_cube(x):
    """x * x * x: the scalar function of :func:`late_op`'s op."""
    return x * x * x


@contextlib.contextmanager
def late_op():
    """The elementwise op ``test_cube`` (scalar function :func:`throwaway_cube`), registered for
    the ``with`` block and then unregistered. Yields ``(op, check)``: ``check()`` runs the op through ``nn.Graph`` on the
    current backend, alone (its derived kernel) and fused with ``exp`` (a generated kernel that
    imports ``throwaway_cube`` from this module), compares both with NumPy, and returns the lone
    op's plan.
    """
    import miniflow as mf
    from miniflow.ops.elementwise import elementwise
    from miniflow.tensor import apply

    class Cube(mf.nn.Graph):
        def build(self, x):
            return apply("test_cube", [x])

    class CubeExp(mf.nn.Graph):
        def build(self, x):
            return apply("test_cube", [x]).exp()

    def check():
        x = np.linspace(-1.5, 1.5, 12, dtype=np.float32).reshape(3, 4)
        alone, fused = Cube(), CubeExp()
        np.testing.assert_allclose(alone(x).numpy(), x.astype(np.float64) ** 3, rtol=1e-6)
        np.testing.assert_allclose(fused(x).numpy(), np.exp(x.astype(np.float64) ** 3),
                                   rtol=1e-6)
        assert [n.op.name for n in alone.ir.nodes] == ["test_cube"]
        assert [n.op.name for n in fused.ir.nodes] == ["fused_elementwise"]
        (plan,) = alone.plans.values()
        return plan

    op = elementwise("test_cube", throwaway_cube, lambda x: x ** 3, amp=None, amp_note="a throwaway op")
    try:
        yield op, check
    finally:
        unregister("test_cube")
