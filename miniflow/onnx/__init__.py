"""ONNX export (the ``onnx`` extra: ``pip install -e ".[onnx]"``): :func:`export` writes an
``nn.Graph`` or a Module as an ONNX model that onnxruntime runs and Netron opens, at any stage
of the pass pipeline (``miniflow.onnx.export``); the op conversions are in
``miniflow.onnx.convert``.

This package imports onnx only when :func:`export` runs, so ``import miniflow.onnx`` works
without the extra."""
from .convert import DOMAIN
from .export import DEFAULT_OPSET, MIN_OPSET, OnnxExportError, export, to_model

__all__ = ["export", "to_model", "OnnxExportError", "DOMAIN", "DEFAULT_OPSET", "MIN_OPSET"]
