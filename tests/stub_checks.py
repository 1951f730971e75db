"""Checks of the cuda runtime (``miniflow.runtime.cuda``) over the stubbed driver
(``benchmarks/cuda_stub.py``): numba-cuda's real launch path, memory and copies, no GPU.

    python tests/stub_checks.py REPORT.json

runs every check of :data:`CHECKS` in this process (the stub replaces numba-cuda's driver for
good, so it is a process of its own; ``tests/test_cuda_host_path.py`` starts it) and writes
``{check name: null, or the failure's traceback}``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CHECKS: dict = {}


def check(fn):
    CHECKS[fn.__name__] = fn
    return fn


def _train_graph(scaler=None, seed=0):
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph, mlp
    mf.manual_seed(seed)
    model = mlp((8, 16, 3))
    graph = TrainGraph(model, mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    if scaler is not None:
        graph.config.enable_amp(True)
        graph.set_grad_scaler(scaler)
    x = np.random.default_rng(seed).uniform(-1, 1, (6, 8)).astype(np.float32)
    y = np.array([0, 1, 2, 1, 0, 2], np.int64)
    return graph, x, y


def _counting(fn):
    """``(fn's result, what the stub counted while it ran)``."""
    from cuda_stub import COUNTS
    before = COUNTS.copy()
    out = fn()
    return out, COUNTS - before


@check
def returned_outputs_are_never_overwritten_and_pool_buffers_are_reused():
    from numba import cuda
    from cuda_stub import COUNTS
    from miniflow.runtime.cuda import OutputPool
    src = cuda.to_device(np.array([1.0, 2.0, 3.0], np.float32))
    pool = OutputPool(src, cuda.stream())
    a = pool()
    src.copy_to_device(np.array([4.0, 5.0, 6.0], np.float32))
    b = pool()
    assert a.copy_to_host().tolist() == [1.0, 2.0, 3.0], a.copy_to_host()
    assert b.copy_to_host().tolist() == [4.0, 5.0, 6.0]
    assert len(pool) == 2
    del a                                            # nothing refers to its memory: reused
    allocs = COUNTS["alloc"]
    c = pool()
    assert len(pool) == 2 and COUNTS["alloc"] == allocs
    view = b[1:]                                     # a view keeps b's memory in use
    reshaped = c.reshape(3)
    del b, c
    src.copy_to_device(np.array([7.0, 8.0, 9.0], np.float32))
    d = pool()
    assert len(pool) == 3, len(pool)
    assert view.copy_to_host().tolist() == [5.0, 6.0]
    assert reshaped.copy_to_host().tolist() == [4.0, 5.0, 6.0]
    assert d.copy_to_host().tolist() == [7.0, 8.0, 9.0]


@check
def a_training_loop_allocates_and_waits_for_nothing():
    from cuda_stub import COUNTS
    graph, x, y = _train_graph()
    loss = graph(x, y)
    loss = graph(x, y)                               # two pool buffers: one result kept alive
    before = COUNTS.copy()
    for _ in range(30):
        loss = graph(x, y)
    counts = COUNTS - before
    assert counts["alloc"] == 0 and counts["free"] == 0, counts
    assert counts["sync"] == 0, counts
    assert counts["h2d_async"] == 60 and counts["h2d"] == 0, counts     # x and y, pinned
    assert counts["d2d_async"] == 30, counts                            # the loss, pooled
    plan = next(iter(graph.plans.values()))
    assert counts["launch"] == 30 * len(plan.steps), (counts, len(plan.steps))
    assert plan.how.startswith("packed launches (no CUDA graph: cuStreamBeginCapture: "
                               "CUDA_ERROR_NOT_SUPPORTED"), plan.how
    float(loss)                                                         # a read: one wait


@check
def input_staging_waits_only_for_the_copies_of_two_calls_back():
    from numba import cuda
    import cuda_stub
    from miniflow.runtime.cuda import InputStager
    buf = cuda.device_array((2, 3), np.float32)
    stage = InputStager([buf], cuda.stream())
    cuda_stub.SETTINGS["events_done"] = False         # the GPU runs behind
    try:
        waits = []
        for k in range(4):
            _, counts = _counting(lambda: stage([np.full((2, 3), k, np.float32)]))
            waits.append(counts["event_wait"])
        assert waits == [0, 0, 1, 1], waits
        assert buf.copy_to_host().tolist() == [[3.0] * 3] * 2
    finally:
        cuda_stub.SETTINGS["events_done"] = True
    for bad, err in ((np.zeros((2, 3), np.float64), TypeError), (np.zeros((3, 2), np.float32),
                                                                 ValueError)):
        try:
            stage([bad])
        except err as e:
            assert "device buffer" in str(e), e
        else:
            raise AssertionError(f"no {err.__name__} for {bad.dtype}{bad.shape}")


@check
def the_whole_plan_replays_as_one_cuda_graph_when_capture_works():
    import cuda_stub
    from miniflow.runtime import cuda as runtime
    cuda_stub.SETTINGS["graphs"] = True
    try:
        graph, x, y = _train_graph()
        graph(x, y)
        plan = next(iter(graph.plans.values()))
        assert plan.how == "one CUDA graph", plan.how
        _, counts = _counting(lambda: graph(x, y))
        assert counts["graph_launch"] == 1 and counts["launch"] == 0, counts
        run = plan._calls[0][0]
        graph_handle, _, launches = run._keep
        packed = [int(fn.launch_args[0]) for fn in launches]
        assert cuda_stub.GRAPHS[int(graph_handle)] == packed      # every kernel, in order
        assert len(packed) == len(plan.steps)
        runtime.GRAPHS[0] = False                                 # turned off: packed launches
        graph2, _, _ = _train_graph()
        graph2(x, y)
        plan2 = next(iter(graph2.plans.values()))
        assert plan2.how == "packed launches (no CUDA graph: CUDA graphs are turned off)", \
            plan2.how
    finally:
        cuda_stub.SETTINGS["graphs"] = False
        runtime.GRAPHS[0] = True


def _always_nonfinite(graph, x, y):
    """Calls the graph once, then makes its non-finite counts read back as 1 at every step (the
    stub runs no kernel, so the buffer keeps what is written into it)."""
    graph(x, y)
    plan = next(iter(graph.plans.values()))
    counts = plan.buffers[plan.graph.results["nonfinite_counts"]]
    counts.copy_to_device(np.ones(counts.shape, np.int64))
    return plan


@check
def the_scaler_reads_lazily_and_still_raises():
    import cuda_stub
    import miniflow as mf
    from miniflow.amp.grad_scaler import NonFiniteGradientsError
    from miniflow.passes.loss_scale import LossScaleState
    from miniflow.runtime.readback import LEDGER
    scaler = mf.amp.StaticGradScaler(1024.0, max_consecutive_skips=3)
    graph, x, y = _train_graph(scaler)
    plan = _always_nonfinite(graph, x, y)
    cuda_stub.SETTINGS["events_done"] = False        # the GPU is behind: nothing applies
    try:
        _, counts = _counting(lambda: [graph(x, y) for _ in range(5)])
        # no read of the device (the input copies wait for their pinned buffers, two calls back)
        assert counts["d2h"] == 0 and len(LEDGER) == 5, (counts, len(LEDGER))
        try:
            scaler.num_skipped_steps                # a read waits, applies, and raises
        except NonFiniteGradientsError as e:
            assert "3 consecutive steps skipped" in str(e), e
        else:
            raise AssertionError("no NonFiniteGradientsError at the read")
    finally:
        cuda_stub.SETTINGS["events_done"] = True
        LEDGER._pending.clear()
    slots = plan.state["scaler_readbacks"][0]         # slot 0: the first call's (all finite)
    counted = plan.context.state[LossScaleState].nonfinite_names
    assert all(s.hosts[1].tolist() == [1] * len(counted) for s in slots[1:6])
    scaler2 = mf.amp.StaticGradScaler(1024.0, max_consecutive_skips=3)
    graph2, _, _ = _train_graph(scaler2, seed=1)
    _always_nonfinite(graph2, x, y)
    graph2(x, y)                                     # the GPU keeps up: applied at once
    graph2(x, y)
    assert scaler2.consecutive_floor_skips == 2
    try:
        graph2(x, y)
    except NonFiniteGradientsError:
        pass
    else:
        raise AssertionError("no NonFiniteGradientsError at the third step")
    assert graph2._optimizers[0].num_skipped_steps == 3


@check
def the_ring_of_pending_read_backs_is_bounded():
    import cuda_stub
    import miniflow as mf
    from miniflow.runtime.readback import LEDGER
    scaler = mf.amp.GradScaler()
    graph, x, y = _train_graph(scaler)
    graph(x, y)
    depth = mf.get_backend().readback_depth
    cuda_stub.SETTINGS["events_done"] = False
    try:
        pending = []
        for _ in range(depth + 2):
            graph(x, y)
            pending.append(len(LEDGER))
        # the ring's next slot still pending at call depth + 1: everything is applied first
        assert pending == list(range(1, depth + 1)) + [1, 2], pending
    finally:
        cuda_stub.SETTINGS["events_done"] = True
        LEDGER.flush()
    assert scaler.found_inf is False


@check
def the_compile_notice_prints_when_a_cuda_kernel_compiles():
    from numba import cuda
    from miniflow.kernels.cuda.launch import Launch
    from miniflow.runtime import cuda as runtime, notice

    def probe(out):                                  # a kernel nothing has compiled yet
        out[0] = 42.0
    out = cuda.device_array(1, np.float32)
    notice._SHOWN[0] = False
    err = io.StringIO()
    with contextlib.redirect_stderr(err), notice.compile_notice():
        runtime.packed_launch(Launch(cuda.jit(probe), 1, 1, "probe"), (out,), cuda.stream())()
    assert notice.NOTICE in err.getvalue(), err.getvalue()
    notice._SHOWN[0] = False
    err = io.StringIO()
    kernel = cuda.jit(probe)
    kernel[1, 1](out)                                # compiled outside the notice
    with contextlib.redirect_stderr(err), notice.compile_notice():
        runtime.packed_launch(Launch(kernel, 1, 1, "probe"), (out,), cuda.stream())()
    assert err.getvalue() == "", err.getvalue()


@check
def a_conv_net_runs_packed_and_as_one_graph_with_the_dispatchers_bytes():
    """The digits LeNet (conv2d, batch norm, max pools; AMP, Adam): every packed launch gets
    numba-cuda's bytes, the CUDA graph captures every kernel, a step allocates and waits for
    nothing."""
    import miniflow as mf
    from cuda_host_overhead import packing_report
    from cuda_stub import COUNTS
    from miniflow.experiments.mlp import TrainGraph
    from miniflow.models import lenet

    def make():
        mf.manual_seed(0)
        model = lenet(width=4)
        graph = TrainGraph(model, mf.optim.Adam(model.parameters(), lr=1e-3))
        graph.config.enable_amp(True)
        graph.set_grad_scaler(mf.amp.GradScaler())
        x = np.random.default_rng(0).uniform(0, 1, (4, 1, 8, 8)).astype(np.float32)
        return graph, x, np.array([0, 1, 2, 3], np.int64)

    report = packing_report(make)
    assert report["launches"] > 0 and not report["mismatches"], report
    assert report["graph_kernels_match"] and report["graph_how"] == "one CUDA graph", report
    graph, x, y = make()
    graph(x, y)
    graph(x, y)
    ops = {n.op.name for n in next(iter(graph.plans.values())).graph.nodes}
    assert {"conv2d", "normalization", "max_pool_2d", "increment"} <= ops, ops
    before = COUNTS.copy()
    for _ in range(5):
        graph(x, y)
    counts = COUNTS - before
    assert counts["alloc"] == 0 and counts["sync"] == 0, counts


def main() -> int:
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    import cuda_stub
    cuda_stub.install()
    import miniflow as mf
    mf.set_backend("cuda")
    report = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            report[name] = None
        except Exception:  # noqa: BLE001 (reported to the test, which fails naming it)
            report[name] = traceback.format_exc()
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
