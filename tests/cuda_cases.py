"""Kernel cases of the CUDA simulator lane (``tests/cuda``) and the PTX lane
(``tests/test_cuda_ptx.py``): the cases of every registered op (``op_cases``: every sample, a
float64 variant of each, every cast), extra cases sized from a launch preset (non-multiples of the
block and tile, grid-stride loops, size-1 and empty dims, fp16 overflow, NaN), plus the small
training graphs the simulator lane runs end to end.

A new op is covered by both lanes as soon as it registers ``samples`` and a ``reference``: its
CUDA kernels are derived from its declaration like the CPU ones, the simulator lane checks them
against the CPU kernels and the float64 reference, the PTX lane compiles them.
Both lanes build the same cases (``all_cases(SIMULATOR)``) and training graphs
(``training_signatures``), so the PTX lane compiles every kernel for every signature the
simulator lane launches (the simulator lane checks that for its training runs).
"""
from __future__ import annotations

import numpy as np

from miniflow.kernels.cuda.launch import SIMULATOR, LaunchConfig

from op_cases import (Case, bfloat16_cases, cast_cases, float64_cases,  # noqa: F401
                      host_buffers, make_node, registry_cases, results)


def ptx_unavailable(cc=(7, 5)):
    """Why ``numba.cuda.compile_ptx`` cannot run here (None when it can): the simulator is on,
    numba-cuda is missing, or NVVM / libdevice (numba-cuda's ``cu12`` extra) are."""
    import importlib.util
    from numba import config
    if config.ENABLE_CUDASIM:
        return "compile_ptx runs without NUMBA_ENABLE_CUDASIM"
    if importlib.util.find_spec("numba_cuda") is None:
        return "numba-cuda is not installed (pip install -e '.[dev]')"
    from numba import cuda, types

    def probe(x):
        x[0] = 1.0

    try:
        cuda.compile_ptx(probe, (types.float32[::1],), cc=cc)
    except Exception as e:  # noqa: BLE001 (NVVM or libdevice missing: the cu12 extra)
        return f"numba.cuda.compile_ptx does not work ({type(e).__name__}: {e}); install " \
               f"numba-cuda[cu12] (pip install -e '.[dev]')"
    return None


def _r(*shape, dt=np.float32, lo=-2.0, hi=2.0, seed=0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(dt)


def extra_cases(cfg: LaunchConfig = SIMULATOR) -> list:
    """Cases beyond the samples, sized from ``cfg``. Shapes that reach strided kernels are fixed
    (their tuple arguments' length is part of the kernel signature); only flat, row and matmul
    sizes follow ``cfg``."""
    n = cfg.block * (cfg.max_blocks + 1) + 5        # > one full grid, not a multiple of the block
    cols = 2 * cfg.row_block + 3                    # a row longer than the block, not a multiple
    t = cfg.tile
    cases = []
    for dt in (np.float32, np.float16):
        cases += [
            Case("relu", [_r(n, dt=dt)], {}, "grid-stride"),
            Case("broadcast_mul", [_r(n, dt=dt), _r(n, dt=dt, seed=1)], {}, "grid-stride"),
            Case("broadcast_mul", [_r(5, 1, 7, dt=dt), _r(3, 1, dt=dt, seed=1)], {},
                 "3d-broadcast"),
            Case("softmax", [_r(3, cols, dt=dt, lo=-6, hi=6)], {}, "long-rows"),
            Case("log_softmax", [_r(3, cols, dt=dt, lo=-6, hi=6)], {}, "long-rows"),
            Case("softmax", [_r(4, 1, dt=dt)], {}, "one-column"),
            Case("sparse_softmax_cross_entropy",
                 [_r(3, cols, dt=dt, lo=-4, hi=4), np.array([0, cols - 1, 5], np.int64)], {},
                 "long-rows"),
            Case("reduce_sum", [_r(3, cols, dt=dt)], {"axis": (1,)}, "long-rows"),
            Case("reduce_sum", [_r(cols, 5, dt=dt)], {"axis": (0,)}, "long-columns"),
            Case("reduce_sum", [_r(2, 3, 4, 5, dt=dt)], {"axis": (0, 2), "keepdims": True},
                 "gathered"),
            Case("reduce_sum", [_r(3, 0, 2, dt=dt)], {"axis": (1,)}, "empty-reduced-dim"),
            Case("top_k", [np.round(_r(n, 20, dt=dt))], {"k": 17}, "grid-stride-sort"),
            Case("cumsum", [_r(n // 4 + 1, 4, dt=dt)], {"dim": 0}, "grid-stride"),
            Case("cumsum_grad", [_r(3, n // 3, dt=dt)], {"dim": 0}, "grid-stride"),
            Case("cumprod", [_r(n // 4 + 1, 4, dt=dt, lo=0.9, hi=1.1)], {"dim": 0},
                 "grid-stride"),
            Case("cumprod_grad", [_r(3, n // 3, dt=dt), _r(3, n // 3, dt=dt, lo=0.9, hi=1.1)],
                 {"dim": 0}, "grid-stride"),
            Case("matmul", [_r(2 * t + 1, 2 * t + 3, dt=dt), _r(2 * t + 3, t + 2, dt=dt, seed=1)],
                 {}, "not-tile-multiple"),
            Case("matmul", [_r(1, 2 * t + 3, dt=dt), _r(2 * t + 3, 1, dt=dt, seed=1)], {},
                 "dot"),
            Case("transpose", [_r(1, 5, 1, dt=dt)], {"perm": (2, 0, 1)}, "size-1-dims"),
            Case("broadcast_like", [_r(1, 3, dt=dt), _r(4, 3, dt=dt)], {"broadcast_axes": (0,)},
                 "size-1"),
            Case("expand", [_r(2, 1, 3, dt=dt)], {"expand_shape": (4, 2, 5, 3)}, "lead-and-size-1"),
            Case("expand", [np.arange(6, dtype=np.int64).reshape(2, 1, 3)],
                 {"expand_shape": (2, 4, 3)}, "int64"),
            Case("add_n", [np.full((2, 3), 40000.0, dt) for _ in range(3)], {}, "overflow"),
            Case("broadcast_add", [np.array([60000.0, -60000.0, np.nan, 1.0], dt),
                                   np.array([60000.0, -60000.0, 1.0, np.nan], dt)], {},
                 "overflow-nan"),
            Case("exp", [np.array([12.0, -20.0, np.inf, -np.inf, np.nan], dt)], {},
                 "overflow-nan"),
            Case("matmul", [np.array([[1.0, np.nan], [2.0, 3.0]], dt), _r(2, 3, dt=dt)], {},
                 "nan"),
            Case("layer_norm", [_r(3, cols, dt=dt), _r(cols, dt=dt, seed=1),
                                _r(cols, dt=dt, seed=2)], {}, "long-rows"),
            Case("layer_norm_grad", [_r(3, cols, dt=dt), _r(3, cols, dt=dt, seed=1),
                                     _r(3, seed=2), _r(3, seed=3, lo=0.5, hi=2.0),
                                     _r(cols, dt=dt, seed=4)], {}, "long-rows"),
            Case("gather", [_r(7, 3, dt=dt), (np.arange(n) % 7).astype(np.int64)], {},
                 "grid-stride"),
            Case("dim_gather", [_r(7, 3, dt=dt), (np.arange(3 * n) % 7).astype(np.int64)
                                .reshape(n, 3)], {"dim": 0}, "grid-stride"),
            Case("dim_scatter_add_like", [_r(n, 2, dt=dt), (np.arange(2 * n) % 2)
                                          .astype(np.int64).reshape(n, 2), _r(n, 2, dt=dt)],
                 {"dim": 1}, "grid-stride"),
            Case("dim_scatter_update", [_r(n, 3, dt=dt), (np.arange(3 * n) % n).astype(np.int64)
                                        .reshape(n, 3)[::-1].copy(), _r(n, 3, dt=dt)],
                 {"dim": 0}, "grid-stride"),
            Case("dim_scatter_add", [_r(2, n, dt=dt), (np.arange(2 * n) % 7).astype(np.int64)
                                     .reshape(2, n), _r(2, n, dt=dt)], {"dim": 1}, "grid-stride"),
            Case("dropout", [_r(n, dt=dt), np.array([5, 3], np.int64)], {"rate": 0.25},
                 "grid-stride"),
            Case("tril", [_r(2, cols, cols // 2, dt=dt)], {"diagonal": -1, "fill_value": -1e4},
                 "wide"),
            Case("batch_matmul", [_r(2, t + 1, 5, dt=dt), _r(2, 5, t + 3, dt=dt, seed=1)], {},
                 "not-tile-multiple"),
        ]
    for dt in (np.float32, np.float16, np.float64):  # every transpose pair, odd sizes
        for ta in (False, True):
            for tb in (False, True):
                m, k, nn = 2 * t + 1, 2 * t + 3, t + 2
                a = _r(k, m, dt=dt) if ta else _r(m, k, dt=dt)
                b = _r(nn, k, dt=dt, seed=1) if tb else _r(k, nn, dt=dt, seed=1)
                cases.append(Case("matmul", [a, b], {"transpose_a": ta, "transpose_b": tb},
                                  f"not-tile-multiple-t{int(ta)}{int(tb)}"))
    cases.append(Case("multi_count_not_finite",      # one gradient per parameter of a 2-layer MLP
                      [_r(16, 8), np.array([np.inf] * 16, np.float32), _r(3, 16), _r(3)], {},
                      "mlp-gradients"))
    for dt in (np.float32, np.float16):              # more elements than the grid's threads
        big = _r(n, dt=dt)
        big[[0, cfg.block, n // 2, n - 1]] = [np.nan, np.inf, -np.inf, np.nan]
        cases.append(Case("multi_count_not_finite",
                          [big, _r(3, dt=dt), np.array([np.inf], dt), np.zeros(0, dt)], {},
                          "grid-stride"))
    mixed = _r(n)                      # two dtype groups, each launched on the whole grid: every
    mixed[[1, n - 2]] = [np.inf, np.nan]   # block writes its row of partial counts at n = 4 inputs
    cases.append(Case("multi_count_not_finite",
                      [mixed, _r(3, dt=np.float16), np.array([np.inf, 1, -np.inf], np.float16),
                       _r(cfg.block + 5, dt=np.float16)], {}, "mixed-dtypes-grid-stride"))
    cases.append(Case("sgd_update", [_r(n), _r(n, seed=1), np.array([0.1]),
                                     np.zeros(1, np.int64)],
                      {"momentum": 0.0}, "no-momentum-grid-stride"))
    cases.append(Case("adam_update", [_r(n), _r(n, seed=1), np.array([0.01]),
                                      np.zeros(1, np.int64), _r(n, seed=2) * 0.1,
                                      _r(n, seed=3, lo=0, hi=0.1), np.array([7], np.int64)], {},
                      "grid-stride"))
    cases.append(Case("adadelta_update", [_r(n), _r(n, seed=1), np.array([1.0]),
                                          np.zeros(1, np.int64), _r(n, seed=2, lo=0, hi=0.5),
                                          _r(n, seed=3, lo=0, hi=0.1), np.array([7], np.int64)],
                      {"rho": 0.9, "eps": 1e-6, "weight_decay": 0.01}, "grid-stride"))
    return cases


def all_cases(cfg: LaunchConfig = SIMULATOR) -> list:
    """Registry samples, float64 and bfloat16 variants, extra cases and cast cases."""
    return (registry_cases() + float64_cases() + bfloat16_cases() + extra_cases(cfg)
            + cast_cases())


SIMULATOR_REPEATS = {"winograd-3x3": "3x3-pad"}
"""Convolution sample geometry (``miniflow.ops.conv.CONV_SAMPLE_GEOMETRIES``) -> the sample
whose CUDA path it repeats; the simulator lane runs the second only (:func:`simulated`). CUDA
computes every convolution of a kind and dtype with one implicit-GEMM kernel
(``kernels/cuda/conv.py``) whose geometry is a runtime argument, so two samples with the same
attributes run the same code, branch for branch (padding, no skipped taps, one group), and
differ only in how many 4 x 4 tiles it loops over. ``winograd-3x3`` exists for the CPU's
Winograd kernels (``tests/test_registry.py`` still runs it on the CPU, the PTX lane compiles its
signatures, identical to ``3x3-pad``'s, and a GPU runs it); under the simulator its 48 tiles made
its 12 cases (3 ops x f32, f16, f64, bf16) 7.4 s of CPU with a warm cache (Intel Xeon)."""


def _conv_geometry(case: Case) -> str | None:
    """The ``CONV_SAMPLE_GEOMETRIES`` label of a convolution case (None for other cases)."""
    from miniflow.ops.conv import CONV_SAMPLE_GEOMETRIES
    x = {"conv2d": 0, "conv_data_grad": 2, "conv_filter_grad": 1}.get(case.op)
    if x is None:
        return None
    return next((label for label, n, c, h, w, _, attrs in CONV_SAMPLE_GEOMETRIES
                 if case.inputs[x].shape == (n, c, h, w) and case.attrs == attrs), None)


def simulated(cases: list) -> list:
    """``cases`` less the repeats of :data:`SIMULATOR_REPEATS`, for the simulator lane.

    Raises:
        AssertionError: a repeat whose attributes are no longer its twin's (it may then reach
            another path of the CUDA kernels: run it, or name another twin)."""
    from miniflow.ops.conv import CONV_SAMPLE_GEOMETRIES
    attrs = {label: a for label, *_, a in CONV_SAMPLE_GEOMETRIES}
    for repeat, twin in SIMULATOR_REPEATS.items():
        assert attrs[repeat] == attrs[twin], f"{repeat} is no longer {twin}'s CUDA path"
    return [c for c in cases if _conv_geometry(c) not in SIMULATOR_REPEATS]


def arg_type(a):
    """The numba type a kernel argument is compiled for: a device array (real or simulated) types
    as the C-contiguous array of its dtype and rank, like the host stand-in it replaces."""
    import numba
    from numba import types
    if isinstance(a, tuple):
        return types.BaseTuple.from_types([arg_type(x) for x in a])
    if not isinstance(a, np.ndarray) and hasattr(a, "copy_to_host"):
        return types.Array(numba.from_dtype(a.dtype), len(a.shape), "C")
    return numba.typeof(a)


HOST_STEP_OPS = ("all_reduce",)
"""Ops whose CUDA steps launch no kernel: the collective copies device buffers to host buffers,
runs MPI on them and copies back (``miniflow.kernels.cuda.collective``)."""


def step_signatures(steps) -> dict:
    """``{(kernel py_func, argument types): kernel label}`` of a list of CUDA steps (host steps,
    which launch no kernel, have none)."""
    out = {}
    for fn, args in steps:
        if not hasattr(fn, "kernel"):
            continue
        sig = tuple(arg_type(a) for a in args)
        out.setdefault((fn.kernel.py_func, sig), fn.name)
    return out


def case_signatures(cases) -> dict:
    """Signatures of every kernel the CUDA builders launch for ``cases``, found by running the
    builders on host stand-in arrays (nothing is compiled or launched)."""
    from miniflow.kernels.cuda import builder_for
    out = {}
    for case in cases:
        node = make_node(case)
        ins, outs = host_buffers(case, node)
        for key, name in step_signatures(builder_for(node.op)(node, ins, outs)).items():
            out.setdefault(key, name)
    return out


# ----------------------------------------------------------------------------- fused pairs
def fused_pair_cases(cfg: LaunchConfig = SIMULATOR) -> list:
    """``(reduce_sum case, consumer op, consumer attrs)`` of the pairs the CUDA backend builds as
    one kernel (``kernels.cuda.fused_builder``): the mean (``scalar_mul`` by 1/N) and a unary map
    of a sum, every float dtype, rows longer than a row block."""
    cols = 2 * cfg.row_block + 3
    out = []
    for dt in (np.float16, np.float32, np.float64):
        out.append((Case("reduce_sum", [_r(cols, dt=dt)], {"axis": (0,)}, "mean"), "scalar_mul",
                    {"scalar": 1.0 / cols}))
        out.append((Case("reduce_sum", [_r(3, cols, dt=dt)], {"axis": (1,)}, "rows"), "exp", {}))
    return out


def fused_pair_nodes(case: Case, consumer: str, attrs: dict):
    """``(producer node, consumer node)`` of a :func:`fused_pair_cases` entry."""
    from miniflow.ir import Node, Value
    from miniflow.ops import get_op
    producer = make_node(case)
    op = get_op(consumer)
    vals = [producer.outputs[0]]
    attrs = op.normalize_attrs(vals, attrs)
    node = Node(op, vals, [], attrs)
    node.outputs = [Value("fused_out", s, d, producer=node) for s, d in op.infer(vals, attrs)]
    return producer, node


def fused_signatures(cfg: LaunchConfig = SIMULATOR) -> dict:
    """Signatures of the fused kernels of :func:`fused_pair_cases` (host stand-ins)."""
    from miniflow.kernels.cuda import fused_builder
    out = {}
    for case, consumer, attrs in fused_pair_cases(cfg):
        producer, node = fused_pair_nodes(case, consumer, attrs)
        ins, _ = host_buffers(case, producer)
        outs = [np.zeros(v.shape, v.dtype.np) for v in node.outputs]
        steps = fused_builder(producer.op, node.op)(producer, node, ins, outs)
        for key, name in step_signatures(steps).items():
            out.setdefault(key, name)
    return out


# ----------------------------------------------------------------------------- training graphs
TRAINING = {"fp32-sgd": {"amp": False, "adam": False}, "amp-adam": {"amp": True, "adam": True},
            "amp-adam-accumulate-clip": {"amp": True, "adam": True, "accumulate": 3,
                                         "clip": 0.5},
            "amp-bf16-sgd": {"amp": True, "adam": False, "half": "bfloat16"},
            "amp-sgd-unfused": {"amp": True, "adam": False, "fused": False}}
"""The training runs of the simulator lane: plain SGD in float32; AMP with a dynamic loss scale
and Adam (fp16 matmuls, fused elementwise ops, the fused update with half copies and the counts
in the matmuls); the same in 3 micro-batches with gradient clipping (unpack, acc, pack,
clip_grad_norm); bfloat16 AMP with SGD (no loss scale); AMP with the unfused update (the casts
and unscaling as separate kernels)."""
TRAIN_X = np.random.default_rng(0).uniform(-1, 1, (6, 8)).astype(np.float32)
TRAIN_Y = np.array([0, 1, 2, 1, 0, 2], np.int64)


def train_graph(amp: bool, adam: bool, accumulate: int = 1, clip: float | None = None,
                half: str = "float16", fused: bool = True):
    """An 8-16-3 MLP and its training graph on the current backend: ``(graph, model)``
    (``accumulate`` micro-batches per call; gradients clipped to a total norm ``clip``; AMP in
    ``half``, float16 with a dynamic loss scale; ``fused``: the fused AMP update)."""
    import miniflow as mf
    from miniflow.experiments.mlp import TrainGraph, mlp
    mf.manual_seed(0)
    model = mlp((8, 16, 3))
    opt = (mf.optim.Adam(model.parameters(), lr=0.01, clip_grad_max_norm=clip) if adam
           else mf.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, clip_grad_max_norm=clip))
    graph = TrainGraph(model, opt)
    if amp:
        graph.config.enable_amp(True, dtype=half)
        graph.config.enable_fused_model_update_cast(fused)
        if half == "float16":
            graph.set_grad_scaler(mf.amp.GradScaler(init_scale=2.0 ** 16, growth_interval=2))
    if accumulate > 1:
        graph.config.set_gradient_accumulation_steps(accumulate)
    return graph, model


def training_signatures() -> dict:
    """Signatures of every kernel the CUDA builders launch for the ``TRAINING`` graphs, found by
    compiling them on a stand-in backend (host memory, CUDA builders, steps that do nothing)."""
    import miniflow as mf
    from miniflow.kernels.common.table import GroupBuilder
    from miniflow.kernels.cuda import builder_for, fused_builder, group_builder
    from miniflow.runtime.backend import BACKENDS, CpuBackend, get_backend

    found: dict = {}

    def recording(build):
        def record(*node_ins_outs):
            steps = build(*node_ins_outs)
            for key, label in step_signatures(steps).items():
                found.setdefault(key, label)
            return [(lambda *args: None, args) for _, args in steps]
        return record

    class SignatureRecorder(CpuBackend):
        name = "cuda-signatures"

        def builder_for(self, op):
            return recording(builder_for(op))

        def fused_builder(self, producer, consumer):
            build = fused_builder(producer, consumer)
            return None if build is None else recording(build)

        def group_builder(self, op):
            group = group_builder(op)
            return None if group is None else GroupBuilder(recording(group.build), group.shared, group.select)

    previous = get_backend().name
    BACKENDS[SignatureRecorder.name] = SignatureRecorder
    try:
        mf.set_backend(SignatureRecorder.name)
        for options in TRAINING.values():
            graph, _ = train_graph(**options)
            graph(TRAIN_X, TRAIN_Y)
    finally:
        del BACKENDS[SignatureRecorder.name]
        mf.set_backend(previous)
    return found
