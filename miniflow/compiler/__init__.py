"""The compile package: what turns an ``nn.Graph`` (modules, optimizers, a scaler and a
``build``) into IR, passes and runnable plans. It sits above the layers it drives (``nn``,
``optim``, ``amp``, ``passes``, ``runtime``); ``miniflow.nn`` re-exports ``nn.Graph`` and
``nn.GraphConfig``, and ``miniflow.compile`` is its :func:`compile`: how users reach it.

- :mod:`~miniflow.compiler.config`: :class:`GraphConfig` (``self.config``) and the
  ``CompileSettings`` the passes read, made from it.
- :mod:`~miniflow.compiler.driver`: :class:`Graph`: tracing, the pass pipeline, plan caching and
  recompiles, the scaler's read-backs, data-parallel rank checks.
- :mod:`~miniflow.compiler.half_copies`: the half weight copies of fused AMP updates.
- :mod:`~miniflow.compiler.optimized`: :func:`compile` (``miniflow.compile``, PyTorch's
  ``torch.compile``; ``torch.compiler.compile`` is it too) and its ``OptimizedModule``.
"""
from .config import GraphConfig
from .driver import Graph
from .optimized import OptimizedModule, compile

__all__ = ["Graph", "GraphConfig", "OptimizedModule", "compile"]
