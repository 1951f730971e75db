"""How plans run, on every backend: constant nodes computed once, node pairs a backend builds as
one kernel (``Backend.fused_builder``), node groups it builds as one (``Backend.group_builder``:
multi-tensor updates, and when moving a node into a group would change a result), and the
lazy read-back of the grad scaler's outcome (``miniflow.runtime.readback``) with a backend
whose read-backs arrive late, as on a GPU that runs behind the host; a failing step names its node,
the cold-start notice appears only when Numba compiles, and what Numba's compiler leaves in
reference cycles does not keep the first results alive."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import miniflow as mf
from miniflow.amp.grad_scaler import NonFiniteGradientsError
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.runtime.backend import BACKENDS, CpuBackend
from miniflow.dtype import float32, float64, int64
from miniflow.ir import Graph
from miniflow.kernels.common.table import GroupBuilder
from miniflow.ops import emitter
from miniflow.runtime.plan import constant_nodes, fused_pairs, grouped_nodes
from miniflow.runtime.readback import LEDGER, HostReadback
from miniflow.runtime.notice import NOTICE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _graph(scaler=None, accumulate=1):
    mf.manual_seed(0)
    model = mlp((8, 16, 3))
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if scaler is not None:
        g.set_grad_scaler(scaler)
    if accumulate > 1:
        g.config.set_gradient_accumulation_steps(accumulate)
    x = np.random.default_rng(0).uniform(-1, 1, (6, 8)).astype(np.float32)
    return g, x, np.array([0, 1, 2, 1, 0, 2], np.int64)


@pytest.fixture(autouse=True)
def _cpu():
    yield
    mf.set_backend("cpu")
    LEDGER._pending.clear()


def test_the_initial_gradient_is_computed_once():
    g, x, y = _graph()
    g(x, y)
    plan = next(iter(g.plans.values()))
    once = {plan.graph.nodes[i].op.name for i in plan._once_owners}
    assert once == {"ones_like", "scalar_mul", "broadcast_like"}, plan.describe()
    assert set(plan._once_owners).isdisjoint(plan._owners)
    assert constant_nodes(plan.graph) == sorted(set(plan._once_owners))
    assert "ones_like" in plan.describe() and " once" in plan.describe()
    assert np.isfinite(float(g(x, y)))              # later runs reuse the constant buffers


def test_constant_nodes_give_the_bits_of_running_them_every_step():
    """A model trained with the constant subgraph run once ends bit for bit where the same
    model ends when every node runs at every step (``constant_nodes`` patched to none)."""
    import miniflow.runtime.plan as plan_module
    g, x, y = _graph()
    for _ in range(3):
        g(x, y)
    once = [p.numpy() for p in g.model.parameters()]
    original = plan_module.constant_nodes
    plan_module.constant_nodes = lambda graph: []
    try:
        g2, _, _ = _graph()
        for _ in range(3):
            g2(x, y)
        assert not next(iter(g2.plans.values())).once_steps
    finally:
        plan_module.constant_nodes = original
    for a, b in zip(once, [p.numpy() for p in g2.model.parameters()]):
        assert a.tobytes() == b.tobytes()


class FusingBackend(CpuBackend):
    """The cpu backend building ``reduce_sum`` then ``scalar_mul`` as one step."""

    name = "cpu-fusing"
    built: list = []

    def fused_builder(self, producer, consumer):
        if (producer.name, consumer.name) != ("reduce_sum", "scalar_mul"):
            return None

        def build(p, c, ins, outs):
            FusingBackend.built.append((p.op.name, c.op.name))
            s = float(c.attrs["scalar"])
            axis = tuple(p.attrs["axis"])

            def step(x, out):
                out[...] = np.float32(np.float32(x.sum(axis=axis)) * np.float32(s))
            step.__name__ = "sum_then_scale"
            return [(step, (ins[0], outs[0]))]
        return build


def test_a_backend_builds_the_mean_loss_as_one_step():
    BACKENDS[FusingBackend.name] = FusingBackend
    try:
        mf.set_backend(FusingBackend.name)
        g, x, y = _graph()
        loss = float(g(x, y))
        plan = next(iter(g.plans.values()))
        assert FusingBackend.built == [("reduce_sum", "scalar_mul")]
        pairs = fused_pairs(plan.graph, plan.backend, constant_nodes(plan.graph))
        (p, c), = pairs.items()
        assert plan.graph.nodes[p].op.name == "reduce_sum"
        assert plan.graph.nodes[c].op.name == "scalar_mul"
        assert c not in plan._owners and "sum_then_scale" in plan.describe()
        mf.set_backend("cpu")
        g2, _, _ = _graph()
        assert float(g2(x, y)) == pytest.approx(loss, rel=1e-6)
    finally:
        del BACKENDS[FusingBackend.name]


def test_no_pair_across_the_micro_batch_boundary_or_with_a_second_reader():
    BACKENDS[FusingBackend.name] = FusingBackend
    try:
        mf.set_backend(FusingBackend.name)
        g, x, y = _graph(accumulate=2)
        g(x, y)
        plan = next(iter(g.plans.values()))
        names = {(plan.graph.nodes[p].op.name, plan.graph.nodes[c].op.name)
                 for p, c in fused_pairs(plan.graph, plan.backend, []).items()}
        assert names == {("reduce_sum", "scalar_mul")}          # the loss, in each micro-batch
        for p, c in fused_pairs(plan.graph, plan.backend, []).items():
            assert len(plan.graph.uses(plan.graph.nodes[p].outputs[0])) == 1
    finally:
        del BACKENDS[FusingBackend.name]


class LateReadback(HostReadback):
    """A read-back whose copies arrive only when waited for (a GPU behind the host)."""

    def ready(self):
        return False


class LateBackend(CpuBackend):
    name = "cpu-late-readback"
    readback_depth = 4

    def readback(self, arrays):
        return LateReadback(arrays, lambda array, host: np.copyto(host, array))


def _late(scaler_factory):
    BACKENDS[LateBackend.name] = LateBackend
    mf.set_backend(LateBackend.name)
    scaler = scaler_factory()
    g, x, y = _graph(scaler)
    x = x.copy()
    x[0, 0] = np.nan                                # every gradient non-finite
    return g, scaler, x, y


def test_late_read_backs_apply_at_the_first_read():
    try:
        g, scaler, x, y = _late(lambda: mf.amp.StaticGradScaler(8.0, max_consecutive_skips=100))
        for _ in range(3):
            g(x, y)
        assert len(LEDGER) == 3                     # nothing read, nothing waited for
        assert g._optimizers[0].__dict__["num_skipped_steps"] == 0
        assert scaler.num_skipped_steps == 3 and len(LEDGER) == 0    # the read applies all
        assert scaler.found_inf is True
        assert g._optimizers[0].num_steps == 3 and g._optimizers[0].num_skipped_steps == 3
    finally:
        del BACKENDS[LateBackend.name]


def test_late_read_backs_still_raise_within_the_ring():
    """``NonFiniteGradientsError`` is raised at the read, or by the call that finds the ring of
    ``readback_depth`` read-backs full, whichever comes first."""
    try:
        g, scaler, x, y = _late(lambda: mf.amp.StaticGradScaler(8.0, max_consecutive_skips=3))
        for _ in range(LateBackend.readback_depth):
            g(x, y)                                 # 4 steps pending, none applied
        with pytest.raises(NonFiniteGradientsError, match="3 consecutive steps skipped"):
            g(x, y)                                 # the ring is full: applied, and raised
    finally:
        del BACKENDS[LateBackend.name]


def test_on_the_cpu_the_outcome_is_recorded_by_the_call_itself():
    scaler = mf.amp.StaticGradScaler(8.0, max_consecutive_skips=2)
    g, x, y = _graph(scaler)
    x = x.copy()
    x[0, 0] = np.nan
    g(x, y)
    assert scaler.__dict__["found_inf"] is True and len(LEDGER) == 0
    with pytest.raises(NonFiniteGradientsError):
        g(x, y)


def test_changing_a_scaler_setting_applies_the_pending_steps_first():
    try:
        g, scaler, x, y = _late(lambda: mf.amp.StaticGradScaler(8.0, max_consecutive_skips=100))
        g(x, y)
        assert len(LEDGER) == 1
        scaler.max_consecutive_skips = 50
        assert len(LEDGER) == 0 and scaler.__dict__["num_skipped_steps"] == 1
    finally:
        del BACKENDS[LateBackend.name]


# ----------------------------------------------------------------------------- node groups
class GroupingBackend(CpuBackend):
    """The cpu backend building groups of ``sgd_update`` nodes as one step (that runs the cpu
    kernel of each member, in order)."""

    name = "cpu-grouping"
    built: list = []

    def group_builder(self, op):
        if op.name != "sgd_update":
            return None
        single = self.builder_for(op)

        def build(nodes, ins, outs):
            GroupingBackend.built.append(len(nodes))
            steps = [s for n, i, o in zip(nodes, ins, outs) for s in single(n, i, o)]

            def step():
                for fn, args in steps:
                    fn(*args)
            step.__name__ = f"sgd_update x{len(nodes)}"
            return [(step, ())]
        return GroupBuilder(build)


def _updates(*layout):
    """A graph of ``sgd_update`` nodes and readers, as ``layout`` says: ``("sgd", k, lr, wd)``
    updates parameter ``k`` with learning rate variable ``lr`` and weight decay ``wd``;
    ``("read", k)`` reads parameter ``k`` (a ``negative``); ``("write_grad", k)`` is an update
    (weight decay 0.5) whose parameter is gradient ``k``."""
    g = Graph()
    emit = emitter(g)
    params = [g.add_variable(f"p{k}", (3,), float32) for k in range(4)]
    grads = [g.add_variable(f"g{k}", (3,), float32) for k in range(4)]
    lrs = [g.add_variable(f"lr{k}", (1,), float64) for k in range(2)]
    skip = g.add_variable("skip", (1,), int64)
    for item in layout:
        if item[0] == "sgd":
            _, k, lr, wd = item
            emit("sgd_update", params[k], grads[k], lrs[lr], skip, weight_decay=wd)
        elif item[0] == "read":
            emit("negative", params[item[1]])
        else:
            emit("sgd_update", grads[item[1]], params[3], lrs[0], skip, weight_decay=0.5)
    return g


@pytest.mark.parametrize("layout,groups", [
    ([("sgd", 0, 0, 0.0), ("sgd", 1, 0, 0.0), ("sgd", 2, 0, 0.0)], {2: [0, 1, 2]}),
    ([("sgd", 0, 0, 0.0), ("sgd", 1, 1, 0.0), ("sgd", 2, 0, 0.0)], {2: [0, 2]}),  # other lr
    ([("sgd", 0, 0, 0.0), ("sgd", 1, 0, 0.9), ("sgd", 2, 0, 0.0)], {2: [0, 2]}),  # other attrs
    ([("sgd", 0, 0, 0.0), ("read", 0), ("sgd", 1, 0, 0.0)], {}),           # p0 read between
    ([("sgd", 0, 0, 0.0), ("read", 2), ("sgd", 1, 0, 0.0)], {2: [0, 2]}),  # another read
    ([("sgd", 0, 0, 0.0), ("write_grad", 0), ("sgd", 1, 0, 0.0)], {}),     # g0 written between
    ([("sgd", 0, 0, 0.0), ("sgd", 0, 0, 0.0)], {}),                        # p0 updated twice
    ([("sgd", 0, 0, 0.0), ("read", 0), ("sgd", 1, 0, 0.0), ("sgd", 2, 0, 0.0)], {3: [2, 3]}),
])
def test_update_groups_form_only_where_moving_them_changes_nothing(layout, groups):
    assert grouped_nodes(_updates(*layout), GroupingBackend(), set()) == groups


def test_grouped_updates_train_bit_for_bit_as_single_ones():
    BACKENDS[GroupingBackend.name] = GroupingBackend
    GroupingBackend.built.clear()
    try:
        mf.set_backend(GroupingBackend.name)
        g, x, y = _graph()
        for _ in range(3):
            g(x, y)
        grouped = [p.numpy() for p in g.model.parameters()]
        plan = next(iter(g.plans.values()))
        assert GroupingBackend.built == [4], plan.describe()       # 2 weights, 2 biases
        assert "sgd_update x4" in plan.describe()
        assert sum(plan.graph.nodes[i].op.name == "sgd_update" for i in plan._owners) == 1
        mf.set_backend("cpu")
        g2, _, _ = _graph()
        for _ in range(3):
            g2(x, y)
        for a, b in zip(grouped, [p.numpy() for p in g2.model.parameters()]):
            assert a.tobytes() == b.tobytes()
    finally:
        del BACKENDS[GroupingBackend.name]


def test_a_node_with_outputs_joins_no_group_past_a_reader_of_them():
    class Negatives(CpuBackend):
        def group_builder(self, op):
            return GroupBuilder(None, shared=()) if op.name == "negative" else None
    g = Graph()
    emit = emitter(g)
    x, y = g.add_input("x", (3,), float32), g.add_input("y", (3,), float32)
    a = emit("negative", x)
    emit("relu", a)                  # reads a: negative(x) cannot move after it
    emit("negative", y)
    emit("negative", x)
    assert grouped_nodes(g, Negatives(), set()) == {3: [2, 3]}


# ------------------------------------------------------------------------------ failures, cold start
def test_a_failing_step_names_its_node():
    mf.manual_seed(0)
    model = mlp((4, 8, 3))
    g = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1))
    g(np.zeros((2, 4), np.float32), np.array([0, 1]))
    with pytest.raises(ValueError, match=r"while running node \d+ `%\d+: f32\[2,3\], %\d+: "
                                         r"f32\[2\] = sparse_softmax_cross_entropy"):
        g(np.zeros((2, 4), np.float32), np.array([0, 3]))


# ------------------------------------------------------------------------------ cold start
_SCRIPT = textwrap.dedent("""
    import numpy as np
    import miniflow as mf
    from miniflow import nn

    class Fn(nn.Graph):
        def build(self, x):
            return (x * 3.0 + 1.0).exp()

    print(Fn()(np.ones((2, 3), np.float32)).numpy()[0, 0])
""")


@pytest.mark.slow  # compiles kernels in fresh processes
def test_compile_notice_only_when_kernels_compile(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=ROOT)
    env.pop("MINIFLOW_BACKEND", None)
    runs = [subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
        assert float(r.stdout) == pytest.approx(np.exp(4.0), rel=1e-6)
    assert runs[0].stderr.count(NOTICE) == 1, runs[0].stderr
    assert NOTICE not in runs[1].stderr, runs[1].stderr        # a warm cache: nothing compiles
    assert os.listdir(tmp_path / "cache" / "miniflow_generated")


def _a_frame_cycle():
    """What Numba's compiler leaves behind: an exception kept in a local of the frame its
    traceback holds, a cycle that keeps this frame object, and through ``f_back`` its callers'
    frame objects with their locals, until the garbage collector runs."""
    try:
        raise ValueError("typing failed, tried the next overload")
    except ValueError as e:
        kept = e                                        # the frame holds it: the cycle
    return kept.args[0]


def test_the_first_results_are_not_kept_by_the_compilers_garbage(monkeypatch):
    import gc
    import weakref
    from numba.core import event
    prepare = CpuBackend.prepare

    def compiling(self, steps):                         # a first run that compiles a kernel
        with event.trigger_event("numba:compile", data={}):
            _a_frame_cycle()
        return prepare(self, steps)
    monkeypatch.setattr(CpuBackend, "prepare", compiling)
    g, x, y = _graph()
    gc.disable()
    try:
        first = g(x, y)
        freed = weakref.ref(first._data)
        del first
        assert freed() is None, "the first loss is kept alive by the compiler's frames"
    finally:
        gc.enable()


class _NoViewBackend(CpuBackend):
    """The cpu backend without buffer views: every reshape and transpose copies (as before
    views)."""

    name = "cpu-no-views"

    def view(self, array, shape):
        return None

    def transpose_view(self, array, perm, nodes):
        return None


def _gpt_losses(steps=3):
    from miniflow.experiments.train_gpt import TrainGPT

    mf.manual_seed(0)
    model = mf.models.gpt(11, 8, n_layer=1, n_head=2, n_embd=8)
    g = TrainGPT(model, mf.optim.AdamW(model.parameters(), lr=1e-2))
    r = np.random.default_rng(0)
    x, y = (r.integers(0, 11, (3, 8)) for _ in range(2))
    return [float(g(x, y)) for _ in range(steps)], next(iter(g.plans.values()))


def _copied_gpt_losses():
    """:func:`_gpt_losses` on :class:`_NoViewBackend` (every reshape and transpose a copy)."""
    BACKENDS[_NoViewBackend.name] = _NoViewBackend
    try:
        mf.set_backend(_NoViewBackend.name)
        return _gpt_losses()
    finally:
        mf.set_backend("cpu")
        del BACKENDS[_NoViewBackend.name]


def test_reshapes_are_views_without_steps_and_train_bit_for_bit_as_copies():
    """plan.allocate: a reshape of a node output or input is a view of its buffer and has no
    step; a reshape of a variable (written in place by the update) keeps its copy; the GPT's
    losses are those of a backend that copies every reshape, bit for bit."""
    losses, plan = _gpt_losses()
    reshapes = [i for i, n in enumerate(plan.graph.nodes) if n.op.name == "reshape"]
    assert reshapes
    for i in reshapes:
        node = plan.graph.nodes[i]
        x, out = plan.buffers[node.inputs[0]], plan.buffers[node.outputs[0]]
        if node.inputs[0].kind == "variable":
            assert i in plan._owners and not np.shares_memory(x, out)
        else:
            assert i not in plan._owners and np.shares_memory(x, out)
    copied, copy_plan = _copied_gpt_losses()
    assert all(i in copy_plan._owners for i in reshapes)
    assert copied == losses


def test_attention_transposes_are_strided_views_and_train_bit_for_bit_as_copies():
    """plan.allocate: the GPT's head split (a transpose read by batch_matmuls only) is a view of
    its input's buffer, the head merge (a transpose, the only reader of a batch_matmul's
    output) gives the batch_matmul a view of its own output to write; neither has a step, and
    the losses are those of a backend that copies every transpose, bit for bit."""
    losses, plan = _gpt_losses()
    transposes = [i for i, n in enumerate(plan.graph.nodes) if n.op.name == "transpose"]
    assert len(transposes) == 8                     # 4 forward, 4 backward, in one layer
    users = plan.graph.users()
    merged = 0
    for i in transposes:
        node = plan.graph.nodes[i]
        x, out = plan.buffers[node.inputs[0]], plan.buffers[node.outputs[0]]
        assert i not in plan._owners and np.shares_memory(x, out)
        assert np.array_equal(out, x.transpose(node.attrs["perm"]))
        if node.inputs[0].producer is not None and \
                node.inputs[0].producer.op.name == "batch_matmul":
            merged += 1
            assert out.flags.c_contiguous and not x.flags.c_contiguous
        else:
            assert all(r.op.name == "batch_matmul" for r in users[node.outputs[0]])
    assert merged == 4                              # y's merge, dq, dk, dv
    copied, copy_plan = _copied_gpt_losses()
    assert all(i in copy_plan._owners for i in transposes)
    assert copied == losses


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_transpose_with_another_reader_or_a_half_product_copies(dtype):
    """A transpose read by a batch_matmul and by an add, or feeding a float16 batch_matmul
    (its operands are widened by a kernel that needs them contiguous), keeps its copy; the
    results are NumPy's."""
    from miniflow.dtype import as_dtype
    from miniflow.runtime.plan import Plan

    r = np.random.default_rng(3)
    a, b = (r.uniform(-1, 1, (2, 3, 4, 5)).astype(dtype) for _ in range(2))
    g = Graph()
    emit = emitter(g)
    va, vb = (g.add_input(n, (2, 3, 4, 5), as_dtype(dtype)) for n in "ab")
    t = emit("transpose", va, perm=(0, 2, 1, 3))
    outs = [emit("batch_matmul", t, emit("transpose", vb, perm=(0, 2, 1, 3)), transpose_b=True)]
    if dtype == np.float32:
        outs.append(emit("broadcast_add", t, t))
    g.set_outputs(outs)
    plan = Plan(g, CpuBackend())
    got = plan.run([a, b])
    at, bt = a.transpose(0, 2, 1, 3), b.transpose(0, 2, 1, 3)
    want = np.matmul(at.astype(np.float64), np.swapaxes(bt, -1, -2).astype(np.float64))
    tol = 1e-6 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got[0], want, rtol=tol, atol=tol)
    copies = [i for i in (0, 1) if i in plan._owners]
    if dtype == np.float32:
        np.testing.assert_array_equal(got[1], at + at)
        assert copies == [0]                        # b's transpose, read by the product alone
    else:
        assert copies == [0, 1]


@pytest.mark.parametrize("rank, printed", [(0, True), (1, False)])
def test_compile_notice_is_printed_by_rank_0_alone(monkeypatch, capsys, rank, printed):
    """Under ``mpiexec -n 2 miniflow train --ddp`` every rank compiles: rank 0 alone prints the
    notice (docs/usage.md: "rank 0 prints"), once."""
    from types import SimpleNamespace

    from miniflow import distributed
    from miniflow.runtime import notice
    monkeypatch.setitem(distributed._STATE, "world", SimpleNamespace(rank=rank, size=2))
    monkeypatch.setattr(notice, "_SHOWN", [False])
    notice._show()
    notice._show()
    assert capsys.readouterr().err.count(NOTICE) == (1 if printed else 0)
