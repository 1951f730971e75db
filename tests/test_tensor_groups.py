"""``miniflow.tensor.Tensor`` is ``TensorCore`` with one method group a module mixed in
(``miniflow/tensor/``): no two of them define the same name (the earlier one in the class's bases
would silently hide the other's method), and every tensor that ``apply``, ``tensor`` and
``detach`` make is of the composed class."""
import numpy as np

import miniflow as mf
from miniflow.tensor import Tensor, apply, tensor
from miniflow.tensor.core import TensorCore

CLASS_ATTRIBUTES = {"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                    "__firstlineno__", "__static_attributes__", "__slotnames__"}
"""What Python puts in every class's namespace (``__slotnames__``: copyreg's cache, set on a
class once an instance is copied or pickled, so present or not by the tests run before)."""


def test_no_two_method_groups_define_the_same_name():
    assert Tensor.__bases__[0] is TensorCore
    seen = {}
    for group in Tensor.__bases__:
        for name in set(vars(group)) - CLASS_ATTRIBUTES:
            assert name not in seen, f"{name} is in both {seen[name]} and {group.__name__}"
            seen[name] = group.__name__
    assert set(vars(Tensor)) - CLASS_ATTRIBUTES == {"__array_priority__"}


def test_every_tensor_made_is_of_the_composed_class():
    x = tensor(np.arange(6.0).reshape(2, 3))
    made = [x, mf.tensor([1, 2]), apply("relu", [x]), x.detach(), x[0], x.sum(), x + 1, x.T,
            *x.split(1)]
    assert [type(t) for t in made] == [Tensor] * len(made)
