"""Exercise 3: write a pass that folds ``cast(cast(x))``.

The AMP pass inserts casts (lesson 4), and a graph can end up with chains such as
``cast(cast(x, float32), float16)``. Write the pass that shortens them: ``cast(cast(x, A), B)``
computes the same as ``cast(x, B)`` when the middle dtype ``A`` holds every value of ``x``'s
dtype exactly (float16 -> float32 -> float64; bfloat16 -> float32), and is ``x`` itself when also
``B`` is ``x``'s dtype. It must *not* fold when ``A`` rounds: ``cast(cast(x, float16), float32)``
of a float32 x changes 1/3 and overflows 70000.

Check it:  python -m miniflow.exercises check 3

Hints (lesson 9 writes a pass): walk ``graph.nodes`` in order; ``node.op.name`` is the op type,
``node.inputs`` / ``node.outputs`` are Values with a ``.dtype`` (``.dtype.name`` is
``"float16"`` ...); ``graph.replace_uses(old, new)`` makes every reader (and result) of ``old``
read ``new``; ``node.inputs = [x]`` rewires one node; ``graph.nodes = kept`` drops nodes. Casts
left unused are fine: dead-code elimination removes them.
"""


def fold_casts(graph, ctx=None):
    """Fold ``cast(cast(x, A), B)`` into ``cast(x, B)`` (or ``x``) where that is exact.

    Args:
        graph: a ``miniflow.ir.Graph`` whose nodes are in topological order.
        ctx: the pipeline's compile context (unused here).

    Returns:
        the same graph, rewritten in place; it must still pass ``graph.verify()`` and compute
        bit for bit the same values.
    """
    raise NotImplementedError
