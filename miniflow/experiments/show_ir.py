"""``miniflow ir``: the IR of a ``miniflow train`` model at any stage of the pass pipeline, as
text, as an ONNX file (``miniflow.onnx.export``) and in Netron.

The graph is the training step ``miniflow train`` compiles (SGD with momentum; with AMP a
dynamic ``GradScaler``), or with ``eval=True`` the evaluation graph (batch norm from its running
statistics), traced with a batch of zeros of the digits' shape.
"""
from __future__ import annotations

import numpy as np

from .. import optim
from ..amp import GradScaler
from ..passes.pipeline import AMP_PASSES, STAGE_ALIASES
from ..random import manual_seed
from .mlp import EvalGraph, TrainGraph
from .train import RECIPES, make_model

__all__ = ["model_graph", "show_ir", "serve_netron"]


def model_graph(model: str, *, amp: bool = False, eval: bool = False, batch_size: int = 64,
                seed: int = 0):
    """``(graph, example inputs)``: ``model``'s training step (or, ``eval``, its evaluation
    graph, modules in eval mode), AMP on when ``amp``, and a batch of ``batch_size`` zeros.

    Raises:
        ValueError: an unknown model (listing the known ones).
    """
    manual_seed(seed)
    net = make_model(model)
    x = np.zeros((batch_size, 64) if model == "mlp" else (batch_size, 1, 8, 8), np.float32)
    if eval:
        net.eval()
        graph, inputs = EvalGraph(net), (x,)
    else:
        r = RECIPES[model]
        graph = TrainGraph(net, optim.SGD(net.parameters(), lr=r.lr, momentum=r.momentum,
                                          weight_decay=r.weight_decay))
        inputs = (x, np.zeros(batch_size, np.int64))
        if amp:
            graph.set_grad_scaler(GradScaler())
    if amp:
        graph.config.enable_amp(True)
    return graph, inputs


def show_ir(model: str, *, amp: bool = False, eval: bool = False, after: str | None = None,
            onnx_path: str | None = None, batch_size: int = 64) -> str:
    """The text ``miniflow ir`` prints: a header and the IR of :func:`model_graph` after stage
    ``after`` (None: every pass); with ``onnx_path`` the same stage is also exported there
    (miniflow-only ops in the ``ai.miniflow`` domain) and a last line says so. An AMP pass as
    ``after`` turns AMP on.

    Raises:
        ValueError: ``after`` is no stage of this graph (naming the stages).
        miniflow.extras.MissingExtraError: ``onnx_path`` without the onnx extra.
    """
    stage = STAGE_ALIASES.get(after, after)
    amp = amp or stage in AMP_PASSES
    graph, inputs = model_graph(model, amp=amp, eval=eval, batch_size=batch_size)
    stage = stage or graph.stages(*inputs)[-1]
    try:
        ir = graph.lower(*inputs, after=stage)
    except ValueError as e:             # the stages of this graph; AMP's only with --amp
        if amp:
            raise
        raise ValueError(f"{e} (with --amp also {', '.join(AMP_PASSES)})") from None
    kind = "evaluation graph" if eval else "training step"
    lines = [f"# {model} {kind}, " + ("AMP (float16)" + ("" if eval else " with a dynamic loss "
                                                          "scale") if amp else "float32")
             + f", batch {batch_size}: the IR after {stage}", str(ir)]
    if onnx_path is not None:
        from ..onnx import DOMAIN, export
        proto = export(graph, inputs, onnx_path, after=stage)
        custom = sum(n.domain == DOMAIN for n in proto.graph.node)
        lines.append(f"# wrote {onnx_path}: {len(proto.graph.node)} ONNX nodes, {custom} of them "
                     f"in the {DOMAIN} domain")
    return "\n".join(lines)


def serve_netron(path: str) -> None:
    """Open ``path`` in Netron (the ``netron`` extra): serve it on localhost, open the browser,
    and wait until Ctrl-C.

    Raises:
        miniflow.extras.MissingExtraError: netron is not installed.
    """
    from ..extras import require
    netron = require("netron", "netron", "miniflow ir --netron")
    netron.start(path)
    try:
        netron.wait()
    except KeyboardInterrupt:
        netron.stop()
