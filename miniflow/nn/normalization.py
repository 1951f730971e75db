"""``nn.BatchNorm1d`` and ``nn.BatchNorm2d``: PyTorch's ``torch.nn.BatchNorm1d`` /
``torch.nn.BatchNorm2d`` (arguments, defaults, the parameters
``weight`` / ``bias`` and the buffers ``running_mean``, ``running_var``, ``num_batches_tracked``
in the state dict), running OneFlow's ``normalization`` op over every axis but 1: BatchNorm1d
takes ``[N, C]`` or ``[N, C, L]``, BatchNorm2d ``[N, C, H, W]``. Under AMP both are the same
``normalization`` node (its AMP category and no-cast statistics are the op's).

In training mode (``Module.train()``) the op normalizes with the batch statistics and updates the
running statistics in place, in the graph (PyTorch's ``momentum`` 0.1 is the op's attribute 0.9,
as OneFlow's ``NormalizationFunctor`` converts it), and ``increment`` adds 1 to
``num_batches_tracked``; in eval mode (``Module.eval()``) it normalizes with the running
statistics and changes nothing.

``track_running_stats`` may be changed after construction, with PyTorch's meaning
(``torch.nn.modules.batchnorm._BatchNorm.forward``): set to False on a module that has running
statistics, a training-mode call uses the batch statistics and updates no buffer (PyTorch passes
no running statistics to the kernel; here the op's moving statistics are scratch arrays), while
eval mode still normalizes with the running statistics; set to True on a module made without
them, nothing is tracked (there is nothing to track). A change recompiles the graphs at their next
call.
"""
from __future__ import annotations

import numpy as np

from ..checks import positive_integer
from ..tensor import apply
from . import functional as F
from .factory import param_dtype
from .module import Module, Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d"]


class _BatchNorm(Module):
    """Batch normalization per channel (dim 1) of an input with :attr:`input_dims` dims
    (PyTorch's ``_BatchNorm``; the subclasses set the dims and their names).

    Args:
        num_features: C.
        eps: added to the variance (1e-5).
        momentum: PyTorch's: ``running = (1 - momentum) * running + momentum * batch`` (0.1).
        affine: learn ``weight`` (ones) and ``bias`` (zeros).
        track_running_stats: keep running statistics for eval mode; if False, the batch
            statistics are used in both modes and no buffers are in the state dict.
        device, dtype: PyTorch's factory keywords (``nn.factory.param_dtype``): the dtype of
            ``weight``, ``bias`` and the running statistics (float32 by default). A float16 or
            bfloat16 layer takes inputs of its dtype and computes in float32 as PyTorch's, its
            running statistics rounded to its dtype; a float32 layer takes half inputs too
            (AMP's case).

    Raises:
        ValueError: a bad size, momentum (None, PyTorch's cumulative average, is not supported)
            or eps, a device other than the process's; at trace time, an input of another rank
            (PyTorch's ``_check_input_dim``) or one whose dim 1 is not ``num_features``.
        TypeError: a dtype that is not a floating dtype of miniflow.
    """

    input_dims: tuple = ()
    """The ranks of the inputs the class takes."""
    input_layout: str = ""
    """Their layouts, for error messages."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None,
                 dtype=None):
        super().__init__()
        dt = param_dtype(type(self).__name__, device, dtype)
        positive_integer(type(self).__name__, "num_features", num_features)
        if momentum is None or not 0.0 <= float(momentum) <= 1.0:
            raise ValueError(f"{type(self).__name__}: momentum must be a number in [0, 1], got "
                             f"{momentum!r} (momentum=None, the cumulative moving average, is "
                             f"not supported)")
        if not float(eps) >= 0.0:
            raise ValueError(f"{type(self).__name__}: eps must be >= 0, got {eps!r}")
        c = int(num_features)
        self.num_features, self.eps, self.momentum = c, float(eps), float(momentum)
        self.affine, self._has_running_stats = bool(affine), bool(track_running_stats)
        self._track = bool(track_running_stats)
        if affine:
            self.weight = Parameter(np.ones(c, dt))
            self.bias = Parameter(np.zeros(c, dt))
        else:
            self.register_buffer("_ones", np.ones(c, dt), persistent=False)
            self.register_buffer("_zeros", np.zeros(c, dt), persistent=False)
        persistent = bool(track_running_stats)   # else: scratch the op needs, not state
        self.register_buffer("running_mean", np.zeros(c, dt), persistent)
        self.register_buffer("running_var", np.ones(c, dt), persistent)
        if track_running_stats:
            self.register_buffer("num_batches_tracked", np.array(0, np.int64))

    @property
    def track_running_stats(self) -> bool:
        """Whether training-mode calls update the running statistics (see the module
        docstring)."""
        return self._track

    @track_running_stats.setter
    def track_running_stats(self, value) -> None:
        value = bool(value)
        if value == self._track:
            return
        if not value and self._has_running_stats and "_untracked_mean" not in self._buffers:
            c = self.num_features  # what the op's moving statistics write while not tracking
            dt = self.running_mean.dtype.np
            self.register_buffer("_untracked_mean", np.zeros(c, dt), persistent=False)
            self.register_buffer("_untracked_var", np.ones(c, dt), persistent=False)
        self._track = value
        self.trace_changed()

    def _optional_state(self) -> tuple:
        """``num_batches_tracked``: missing from checkpoints of PyTorch before 0.4.1 (batch norm's
        state-dict version 2); it keeps its value, as PyTorch's ``_load_from_state_dict``."""
        return ("num_batches_tracked",) if self._has_running_stats else ()

    def forward(self, x):
        name = type(self).__name__
        if x.ndim not in self.input_dims:
            raise ValueError(f"{name}: expected a {self.input_layout}, got shape "
                             f"{list(x.shape)} ({x.ndim}-D)")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{name}({self.num_features}): the input has {x.shape[1]} "
                             f"channels in dim 1 (shape {list(x.shape)}), expected "
                             f"{self.num_features}: make the layer {name}({x.shape[1]}), or "
                             f"check the layer before it (its output channels) and that the "
                             f"input is channels-first [N, C, ...]")
        batch_stats = self.training or not self._has_running_stats
        stats = (self.running_mean, self.running_var)
        if self.training and self._has_running_stats:
            if self._track:
                apply("increment", [self.num_batches_tracked])
            else:
                stats = (self._untracked_mean, self._untracked_var)
        weight = self.weight if self.affine else self._ones
        bias = self.bias if self.affine else self._zeros
        return F.batch_norm(x, *stats, weight, bias, training=batch_stats,
                            momentum=self.momentum, eps=self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalization of ``x [N, num_features]`` or ``[N, num_features, L]`` per channel
    (``torch.nn.BatchNorm1d``; statistics over N, and L when present). Arguments, state-dict
    keys and errors as :class:`_BatchNorm`; training on one value per channel (``[1, C]``)
    raises at trace time, as PyTorch's "Expected more than 1 value per channel"."""

    input_dims = (2, 3)
    input_layout = "2-D input [N, C] or a 3-D input [N, C, L]"


class BatchNorm2d(_BatchNorm):
    """Batch normalization of ``x [N, num_features, H, W]`` per channel
    (``torch.nn.BatchNorm2d``); arguments, state-dict keys and errors as :class:`_BatchNorm`."""

    input_dims = (4,)
    input_layout = "4-D input [N, C, H, W]"
