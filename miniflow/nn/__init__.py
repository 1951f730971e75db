"""Neural-network API: Module, Parameter, layers, functional ops and the lazy nn.Graph."""
from . import functional
from .graph import Graph, GraphConfig
from .layers import Linear, ReLU, Sequential
from .module import Module, Parameter

__all__ = ["Graph", "GraphConfig", "Linear", "Module", "Parameter", "ReLU", "Sequential",
           "functional"]
