"""The pass pipeline's context (``miniflow/passes/pipeline.py``): frozen settings, one state type
per pass, no loose field two passes share.

Modelled on OneFlow's ``JobPassCtx`` (``oneflow/core/job_rewriter/job_pass.h``): a pass reads the
job's settings and the ``JobPassState`` another pass stored, by type (``GetState<T>``).
"""
import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.passes import pipeline
from miniflow.passes.auto_mixed_precision import AmpState
from miniflow.passes.autograd import AutogradState
from miniflow.passes.data_parallel import DataParallelState
from miniflow.passes.fuse_model_update_cast import FusedUpdateState, copy_name
from miniflow.passes.loss_scale import LossScaleState
from miniflow.passes.pipeline import CompileContext, CompileSettings, PassStates

PASSES_DIR = Path(pipeline.__file__).parent


def test_the_context_holds_settings_and_states_only():
    assert [f.name for f in dataclasses.fields(CompileContext)] == ["settings", "state"]
    ctx = CompileContext()
    with pytest.raises(AttributeError):
        ctx.initial_grad = None            # no loose field: passes share state through types


def test_settings_are_frozen_and_copied():
    trainable, names = ["w"], {1: "w"}
    s = CompileSettings(trainable=trainable, param_names=names)
    assert len(dataclasses.fields(CompileSettings)) == 11
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.print_ir = True
    trainable.append("b")
    names[2] = "b"                          # the caller's lists stay the caller's
    assert s.trainable == ("w",) and dict(s.param_names) == {1: "w"}
    with pytest.raises(TypeError):
        s.param_names[3] = "c"


def test_pass_states_are_stored_by_their_own_type():
    states = PassStates()
    with pytest.raises(KeyError, match=r"no LossScaleState: its pass "
                                       r"\(miniflow.passes.loss_scale\) has not run"):
        states[LossScaleState]
    assert states.get(LossScaleState) is None
    with pytest.raises(TypeError, match="store a state under its own type"):
        states[LossScaleState] = AutogradState(None)


def _ctx_uses(tree) -> list:
    """``(attribute, line, is_store)`` for every ``ctx.<attribute>`` in ``tree``."""
    return [(n.attr, n.lineno, isinstance(n.ctx, ast.Store)) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "ctx"]


def test_passes_touch_only_settings_and_state():
    """No pass writes a field of the context, and none reads one but ``settings`` and ``state``:
    what one pass hands another goes through the state type the writer's module defines."""
    found = []
    for path in sorted(PASSES_DIR.glob("*.py")):
        for attr, line, store in _ctx_uses(ast.parse(path.read_text())):
            if store or attr not in ("settings", "state"):
                found.append(f"{path.name}:{line}: ctx.{attr}{' =' if store else ''}")
    assert not found, found


def test_each_pass_stores_only_its_own_state(monkeypatch):
    """Compile a training graph with every pass on (AMP, dynamic loss scaling, data parallel on one
    rank, accumulation): each state appears after the pass whose module defines its type."""
    stored = {}

    def watched(name, fn):
        def run(graph, ctx):
            before = set(ctx.state)
            graph = fn(graph, ctx)
            for kind in set(ctx.state) - before:
                assert kind.__module__ == fn.__module__, (name, kind)
                stored[kind] = name
            return graph
        return run

    monkeypatch.setattr(pipeline, "PASSES", [(n, watched(n, f)) for n, f in pipeline.PASSES])
    mf.manual_seed(0)
    model = mlp((8, 16, 4))
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    g.config.enable_amp()
    g.config.enable_data_parallel()
    g.config.set_gradient_accumulation_steps(2)
    g.set_grad_scaler(mf.amp.GradScaler())
    g(np.ones((4, 8), np.float32), np.zeros(4, np.int64))
    assert stored == {AutogradState: "autograd", AmpState: "auto_mixed_precision",
                      DataParallelState: "data_parallel", LossScaleState: "loss_scale",
                      FusedUpdateState: "fuse_model_update_cast"}
    state = g.compile_context.state
    assert None not in (state[LossScaleState].skip_if, state[LossScaleState].inv_scale)
    copies = dict(state[FusedUpdateState].half_copies)
    assert {"model.0.weight", "model.2.weight"} <= set(copies)
    assert all(c == copy_name(p, mf.float16) and c in g.ir.variables for p, c in copies.items())
