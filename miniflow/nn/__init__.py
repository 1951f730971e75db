"""Neural-network API: Module, Parameter, layers (Linear, Conv2d, BatchNorm1d/2d, pools, Flatten ...),
containers (Sequential, ModuleList, ModuleDict, ParameterList, ParameterDict), the losses
(CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, BCEWithLogitsLoss, KLDivLoss), activations,
functional ops, ``init`` (PyTorch's in-place initialisers), and (re-exported from the compile
package ``miniflow.compiler``) the lazy ``nn.Graph`` and ``nn.GraphConfig``.

``nn.Graph`` lives above this package (it compiles modules, optimizers and AMP settings), so it is
imported on first use (``__getattr__``), the one import from ``miniflow.nn`` to a higher layer.
"""
from . import activations, functional, init
from .activations import *  # noqa: F401,F403  (ReLU ... and their functional forms)
from .multihead_attention import MultiheadAttention
from .containers import ModuleDict, ModuleList, ParameterDict, ParameterList
from .conv import Conv2d
from .dropout import Dropout
from .layer_norm import LayerNorm, RMSNorm
from .layers import Flatten, Identity, Linear, LogSoftmax, Sequential, Softmax
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, KLDivLoss, L1Loss, MSELoss, NLLLoss
from .module import Module, Parameter
from .normalization import BatchNorm1d, BatchNorm2d
from .pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .sparse import Embedding

__all__ = ["Graph", "GraphConfig", "Linear", "Module", "Parameter", "Sequential", "ModuleList",
           "ModuleDict", "ParameterList", "ParameterDict", "Flatten", "Identity", "Conv2d",
           "BatchNorm1d", "BatchNorm2d", "Dropout", "LayerNorm", "RMSNorm", "Embedding",
           "MultiheadAttention", "CrossEntropyLoss", "NLLLoss", "BCEWithLogitsLoss", "KLDivLoss",
           "MSELoss", "L1Loss", "Softmax", "LogSoftmax", "MaxPool2d", "AvgPool2d",
           "AdaptiveAvgPool2d", "functional", "init",
           *(name for name in activations.__all__ if not name.islower())]


_NOT_IN_NN = {"utils": "gradient clipping (torch.nn.utils.clip_grad_norm_) is an optimizer option "
                       "computed in the graph: SGD / Adam / AdamW(..., clip_grad_max_norm=1.0), "
                       "clipped per param group (OneFlow's rule; docs/differences.md)"}
"""PyTorch's ``torch.nn`` names miniflow has not, and what instead (``__getattr__``)."""


def __getattr__(name):
    """``Graph`` and ``GraphConfig``, imported on first use.

    Raises:
        AttributeError: any other name the package has not; one of :data:`_NOT_IN_NN` says
            what to use instead."""
    if name in ("Graph", "GraphConfig"):
        from .. import compiler as package  # above nn: imported when first asked for
        return getattr(package, name)
    why = _NOT_IN_NN.get(name)
    raise AttributeError(f"module 'miniflow.nn' has no attribute {name!r}"
                         + (f": {why}" if why else ""))
