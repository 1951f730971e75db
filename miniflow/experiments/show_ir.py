"""``miniflow ir``: the IR of a ``miniflow train`` model at any stage of the pass pipeline, as
text, as an ONNX file (``miniflow.onnx.export``) and in Netron.

The graph is the training step ``miniflow train`` compiles (SGD with momentum; with AMP a
dynamic ``GradScaler``), or with ``eval=True`` the evaluation graph (batch norm from its running
statistics), traced with a batch of zeros of the digits' shape. For ``"gpt"`` it is the
training step of ``miniflow train --model gpt`` (its ``GPT_DEFAULTS``: AdamW, a 2-layer, 4-head,
96-wide GPT on the vocabulary of the standard library's text; with AMP float16 and a dynamic
``GradScaler``), or with ``eval=True`` its loss in eval mode, traced with windows of zeros.
"""
from __future__ import annotations

import numpy as np

from .. import optim
from ..amp import GradScaler
from ..data import stdlib_text
from ..passes.pipeline import AMP_PASSES, DATA_PARALLEL_PASSES, STAGE_ALIASES
from ..random import manual_seed
from .mlp import EvalGraph, TrainGraph
from .train import RECIPES, make_model
from .train_gpt import GPT_DEFAULTS, EvalGPT, _gpt_training

__all__ = ["model_graph", "show_ir", "serve_netron"]


def model_graph(model: str, *, amp: bool = False, eval: bool = False,
                batch_size: int | None = None, seed: int = 0):
    """``(graph, example inputs)``: ``model``'s training step (or, ``eval``, its evaluation
    graph, modules in eval mode), AMP on when ``amp``, and a batch of ``batch_size`` zeros
    (None: 64; ``"gpt"``: its ``GPT_DEFAULTS`` batch, 32, of int64 windows of 64 ids and their
    targets).

    Raises:
        ValueError: an unknown model (listing the known ones).
    """
    manual_seed(seed)
    if model == "gpt":
        return _gpt_graph(amp, eval, batch_size or GPT_DEFAULTS["batch_size"])
    batch_size = batch_size or 64
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


def _gpt_graph(amp: bool, eval: bool, batch_size: int):
    """:func:`model_graph` of ``"gpt"``: ``miniflow train --model gpt``'s model and training
    step (AMP: fp16 with a dynamic GradScaler), or its ``EvalGPT`` in eval mode."""
    c = {**GPT_DEFAULTS, "batch_size": batch_size}
    model, _, graph, _ = _gpt_training(stdlib_text(), c, None, "fp16" if amp else None, 1, False)
    if eval:
        graph = EvalGPT(model.eval())
        if amp:
            graph.config.enable_amp(True)
    ids = np.zeros((batch_size, c["block_size"]), np.int64)
    return graph, (ids, ids)


def show_ir(model: str, *, amp: bool = False, eval: bool = False, after: str | None = None,
            onnx_path: str | None = None, batch_size: int | None = None) -> str:
    """The text ``miniflow ir`` prints: a header and the IR of :func:`model_graph` after stage
    ``after`` (None: every pass); with ``onnx_path`` the same stage is also exported there
    (miniflow-only ops in the ``ai.miniflow`` domain) and a last line says so. An AMP pass as
    ``after`` turns AMP on.

    Raises:
        ValueError: ``after`` is no stage of this graph (naming ``--after``, the value and
            the stages; before the graph is lowered).
        miniflow.extras.MissingExtraError: ``onnx_path`` without the onnx extra.
    """
    stage = STAGE_ALIASES.get(after, after)
    amp = amp or stage in AMP_PASSES
    graph, inputs = model_graph(model, amp=amp, eval=eval, batch_size=batch_size)
    stages = graph.stages(*inputs)
    stage = stage or stages[-1]
    if stage not in stages:             # named as the command line's option, not lower's
        why = (f" ({stage} runs only in the data-parallel step of train --ddp, which ir does "
               "not build)" if stage in DATA_PARALLEL_PASSES else "")
        also = "" if amp else f" (with --amp also {', '.join(AMP_PASSES)})"
        raise ValueError(f"--after {after} is no stage of this graph{why}; choose one of "
                         f"{', '.join(stages)}{also}")
    ir = graph.lower(*inputs, after=stage)
    kind = "evaluation graph" if eval else "training step"
    lines = [f"# {model} {kind}, " + ("AMP (float16)" + ("" if eval else " with a dynamic loss "
                                                          "scale") if amp else "float32")
             + f", batch {len(inputs[0])}: the IR after {stage}", str(ir)]
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
