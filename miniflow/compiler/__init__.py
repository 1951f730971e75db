"""The compile package: what turns an ``nn.Graph`` (modules, optimizers, a scaler and a
``build``) into IR, passes and runnable plans. It sits above the layers it drives (``nn``,
``optim``, ``amp``, ``passes``, ``runtime``); ``miniflow.nn`` re-exports its two public names,
``nn.Graph`` and ``nn.GraphConfig``, which is how users reach it.

- :mod:`~miniflow.compiler.config`: :class:`GraphConfig` (``self.config``) and the
  ``CompileSettings`` the passes read, made from it.
- :mod:`~miniflow.compiler.driver`: :class:`Graph`: tracing, the pass pipeline, plan caching and
  recompiles, the scaler's read-backs, data-parallel rank checks.
- :mod:`~miniflow.compiler.half_copies`: the half weight copies of fused AMP updates.
"""
from .config import GraphConfig
from .driver import Graph

__all__ = ["Graph", "GraphConfig"]
