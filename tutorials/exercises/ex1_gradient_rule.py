"""Exercise 1: write the gradient rule of an op.

The op ``exercise1_cube`` computes ``y = x**3`` elementwise. Its gradient rule is what the
autograd pass (lesson 2) calls for each of its nodes: it gets the node, the gradient flowing into
the node's output, and ``emit``, and it must *emit* the backward nodes that compute the gradient
of its input, made of ops that already exist, and return them.

Check it:  python -m miniflow.exercises check 1

Hints: ``node.inputs[0]`` is ``x`` (a Value); ``grads[0]`` is ``dy``, the gradient of the loss with
respect to ``y``. ``emit("broadcast_mul", a, b)`` multiplies two Values, ``emit("scalar_mul", a,
scalar=3.0)`` multiplies by a number. Lesson 8 shows a complete op with its rule.
"""


def cube_grad(node, grads, emit):
    """The gradient rule of ``y = x**3``.

    Args:
        node: the forward node; ``node.inputs[0]`` is x (float, any shape).
        grads: ``[dy]``, the gradient of the loss w.r.t. y (the shape and dtype of x).
        emit: ``emit(op_name, *inputs, **attrs) -> Value`` adds a backward node.

    Returns:
        ``[dx]``: one Value per input of the op, dx = dy * d(x**3)/dx.
    """
    raise NotImplementedError
