"""Exercise 3 checker: a pass that folds ``cast(cast(x))``.

The learner's ``fold_casts(graph, ctx=None)`` runs on small IRs with chains of casts; after it,
``Graph.verify()`` must hold, the reference interpreter ``miniflow.ir.evaluate`` must give the
same values, bit for bit, as before the pass (on values chosen so that a wrong fold changes
them: 1/3, 70000, 2**-25, NaN ...), and the casts left (after miniflow's dead-code elimination)
must be as few as the rule allows. The rule: ``cast(cast(x, A), B)`` equals ``cast(x, B)`` when
``A`` holds every value of ``x``'s dtype exactly (float16 -> float32 -> float64, bfloat16 ->
float32); it is ``x`` itself when also ``B`` is ``x``'s dtype. Source: XLA's
``AlgebraicSimplifier::HandleConvert`` and TVM's ``SimplifyExpr`` fold convert-of-convert the
same way, only when the middle type is wider.
"""
from __future__ import annotations

import numpy as np

from ..dtype import as_dtype
from ..ir import Graph, evaluate
from ..ops import emitter
from ..passes.dead_code_elimination import dead_code_elimination
from . import NotYet, learner_call

TITLE = "a pass folding cast(cast(x))"
STUB = "ex3_fold_casts.py"
FUNCTION = "fold_casts"

VALUES = [1.0 / 3.0, 70000.0, 2.0 ** -25, 65504.0, -0.0, np.nan, np.inf, 1e-40, 3.14159]


def _chain(x_dtype: str, casts: tuple, extra_reader: bool = False) -> Graph:
    """``x`` cast through ``casts`` in turn; the output is the last cast (and, with
    ``extra_reader``, the first cast is a second output)."""
    g = Graph()
    emit = emitter(g)
    x = g.add_input("x", (len(VALUES),), as_dtype(x_dtype))
    v, first = x, None
    for dt in casts:
        v = emit("cast", v, dtype=dt)
        first = first or v
    g.set_outputs([v, first] if extra_reader else [v])
    return g


CASES = [
    # (x dtype, casts, extra reader, casts left, what the case teaches)
    ("float16", ("float32", "float16"), False, 0,
     "float16 -> float32 -> float16 is exact: the pass should return x itself"),
    ("float32", ("float16", "float32"), False, 2,
     "float32 -> float16 -> float32 rounds (1/3, 70000 -> inf): both casts must stay"),
    ("float32", ("float64", "float16"), False, 1,
     "float32 -> float64 -> float16 is one cast float32 -> float16"),
    ("float16", ("float32", "bfloat16"), False, 1,
     "float16 -> float32 -> bfloat16 is one cast float16 -> bfloat16"),
    ("float16", ("float32", "float64", "float16"), False, 0,
     "a chain of three exact widenings back to float16 is x itself"),
    ("float32", ("float64", "float32"), True, 1,
     "the middle cast has another reader (an output): it stays, the outer cast goes"),
    ("bfloat16", ("float16", "float32"), False, 2,
     "bfloat16 -> float16 loses range (1e-40, 70000 fit bfloat16, not float16): nothing folds"),
]


def _casts(g: Graph) -> int:
    return sum(n.op.name == "cast" for n in g.nodes)


def check(module) -> list:
    """Raise :class:`NotYet` on the first wrong graph; return the passed checks."""
    passed = []
    for x_dtype, casts, extra, left, what in CASES:
        g = _chain(x_dtype, casts, extra)
        before = str(g)
        with np.errstate(over="ignore"):
            x = np.array(VALUES, np.float64).astype(as_dtype(x_dtype).np)
            want = evaluate(g, [x])
        got_graph = learner_call(f"{FUNCTION}(graph)", module.fold_casts,
                                 _chain(x_dtype, casts, extra), None)
        if not isinstance(got_graph, Graph):
            raise NotYet(f"{FUNCTION} must return the graph (rewritten in place); it returned "
                         f"{got_graph!r}")
        chain = f"x: {x_dtype} -> " + " -> ".join(casts)
        try:
            got_graph.verify()
        except Exception as e:
            raise NotYet(f"on {chain}: the graph no longer verifies after your pass: {e}. IR "
                         f"before your pass:\n{before}") from e
        with np.errstate(over="ignore"):
            got = evaluate(got_graph, [x])
        for k in want:
            same = want[k].dtype == got[k].dtype and np.array_equal(
                want[k].view(np.uint8), got[k].view(np.uint8))
            if not same:
                raise NotYet(f"on {chain}: your pass changed the values of result {k}; for x = "
                             f"{x.tolist()} it was {want[k].tolist()} before your pass and is "
                             f"{got[k].tolist()} after it. Fold only when the "
                             f"middle dtype holds every value of x's dtype exactly.")
        n = _casts(dead_code_elimination(got_graph))
        if n != left:
            raise NotYet(f"on {chain}: {n} cast(s) left after your pass (and dead-code "
                         f"elimination), {left} expected: {what}")
        passed.append(f"{chain}{' (middle cast also an output)' if extra else ''}: {what}")
    return passed
