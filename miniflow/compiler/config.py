"""What configures a compile: :class:`GraphConfig` (``nn.GraphConfig``, ``self.config`` inside an
``nn.Graph``: OneFlow's ``nn.Graph.config``) and :func:`compile_settings`, which turns a graph's
configuration, optimizers, grad scaler and parameters into the passes' frozen
:class:`~miniflow.passes.pipeline.CompileSettings`.
"""
from __future__ import annotations

from .. import distributed
from ..checks import boolean, integer, is_integer
from ..amp.lists import AmpLists
from ..dtype import float16
from ..passes.auto_mixed_precision import AmpConfig
from ..passes.data_parallel import DataParallelConfig
from ..passes.loss_scale import POLICIES
from ..passes.pipeline import CompileSettings

__all__ = ["GraphConfig", "compile_settings"]


class GraphConfig:
    """Per-graph options (``self.config`` inside an nn.Graph). A change after the graph has been
    called makes it recompile its plans at the next call.

    Attributes:
        print_ir: print the IR after trace and after every pass when a plan is compiled.
        amp: the AMP settings (an ``AmpConfig``), or None when AMP is off.
        loss_scale_policy: how the loss scale meets a float16 initial gradient (``"fp32"``,
            ``"cast_back"`` or ``"legacy"``; see ``miniflow.passes.loss_scale``).
        data_parallel: the data-parallel settings (a ``DataParallelConfig``).
        data_parallel_enabled: True or False as ``enable_data_parallel`` set it; None (the
            default): on when the process world has more than one rank.
        gradient_accumulation_steps: micro-batches per call (1: none; see
            :meth:`set_gradient_accumulation_steps`).
        fused_model_update_cast: under AMP, fuse the weight casts and the unscaling into
            multi-tensor updates that write half copies of the weights (on by default; see
            :meth:`enable_fused_model_update_cast`).
        performance_hints: OneFlow's performance options taken as no-ops (name -> the value
            given; see :meth:`allow_fuse_cast_scale` ...): recorded, they change nothing.

    OneFlow's ``GraphConfig`` (``python/oneflow/nn/graph/graph_config.py``) also has options
    miniflow has no use for: those that only order or place work (``set_outputs_buffer_size``,
    ``enable_straighten_algorithm``, ``enable_compress_memory``,
    ``enable_choose_best_memory_allocation``) or fuse the same arithmetic into one kernel
    (``allow_fuse_cast_scale``, ``allow_fuse_model_update_ops``, ``enable_multi_tensor_update``)
    are accepted and change nothing; those that would change what is computed or need a feature
    miniflow lacks (``allow_fuse_add_to_output(True)``, ``enable_cudnn_conv_heuristic_search_algo``,
    ``enable_zero(True)``, ``enable_auto_parallel(True)``) raise ValueError saying what to do.
    """

    def __init__(self):
        self.print_ir = False
        self.amp: AmpConfig | None = None
        self.loss_scale_policy = POLICIES[0]
        self.data_parallel = DataParallelConfig()
        self.data_parallel_enabled: bool | None = None
        self.gradient_accumulation_steps = 1
        self.fused_model_update_cast = True
        self.performance_hints: dict = {}
        self._training = False   # OneFlow's train_conf: set by nn.Graph.add_optimizer
        self.version = 0  # bumped by every change: the owning nn.Graph then recompiles

    @property
    def training(self) -> bool:
        """True once the graph has an optimizer (OneFlow's ``GraphConfig.training``: its
        ``train_conf``, set by ``nn.Graph.add_optimizer``)."""
        return self._training

    def __repr__(self) -> str:
        """OneFlow's ``(CONFIG:config:GraphConfig(training=..., ))``, with miniflow's settings that
        are not at their defaults."""
        items = [f"training={self.training}"]
        if self.amp is not None:
            items.append(f"amp={self.amp.dtype}")
        if self.gradient_accumulation_steps != 1:
            items.append(f"gradient_accumulation_steps={self.gradient_accumulation_steps}")
        if self.data_parallel_enabled is not None:
            items.append(f"data_parallel={self.data_parallel_enabled}")
        return f"(CONFIG:config:{type(self).__name__}({', '.join(items)}, ))"

    def debug(self, print_ir: bool = True) -> None:
        """Print the IR after every pass when a plan is next compiled (a new input signature, or
        a changed configuration); it does not recompile existing plans by itself.

        Raises:
            TypeError: ``print_ir`` is not a bool.
        """
        self.print_ir = boolean("debug", "print_ir", print_ir)

    def set_gradient_accumulation_steps(self, value: int) -> None:
        """Run every call of the graph as ``value`` micro-batches and one update (OneFlow's
        ``config.set_gradient_accumulation_steps``, with OneFlow's semantics).

        A call passes one mini-batch. Every input is split along dim 0 into ``value`` equal
        micro-batches (``unpack``), ``build`` runs on one micro-batch, and the forward and
        backward nodes run once per micro-batch, in one set of buffers (the activations of one
        micro-batch, not of the mini-batch). The parameter gradients are summed over the
        micro-batches and divided by ``value`` (the mean of the micro-batch gradients: for a
        mean-reduced loss over equal micro-batches, the mini-batch's gradient), then the
        loss-scale stage, clipping and the optimizer updates run once. Every output is packed
        along dim 0 (``pack``): a scalar loss comes back as the ``[value]`` micro-batch losses
        (their mean is the mini-batch's loss). With a grad scaler, the initial gradient is scaled
        in every micro-batch and a non-finite gradient in any micro-batch skips the whole update.
        See ``miniflow.passes.gradient_accumulation``. The graph recompiles at its next call.

        Raises:
            ValueError: ``value`` is not an integer >= 1. (At the next call: ValueError when an
                input's dim 0 does not split into ``value`` equal parts.)
        """
        if not is_integer(value) or value < 1:
            raise ValueError(f"set_gradient_accumulation_steps: value must be an integer >= 1 "
                             f"(1: no accumulation), got {value!r}")
        self.gradient_accumulation_steps = int(value)
        self.version += 1

    def enable_amp(self, mode: bool = True, dtype=float16, *, lists: AmpLists | None = None,
                   white_add=(), black_add=(), gray_add=(), clear_add=(), white_remove=(),
                   black_remove=(), gray_remove=(), clear_remove=(),
                   loss_scale_policy: str = POLICIES[0]) -> None:
        """Turn automatic mixed precision on (or off with ``mode=False``; OneFlow's
        ``config.enable_amp(mode, dtype=...)``).

        The AMP pass then runs after autograd on the forward and backward graph: white ops run in
        ``dtype`` (float16 or bfloat16), casts go on the edges between white and other ops,
        parameters stay float32 master weights (OneFlow's ``config.enable_amp``). bfloat16 has
        float32's range, so it needs no loss scaling (a grad scaler may still be set); float16
        usually does (``set_grad_scaler``).

        Args:
            dtype: the half type: ``miniflow.float16`` (default) or ``miniflow.bfloat16``.
            lists: the op type lists to start from (an :class:`~miniflow.amp.AmpLists`; default
                OneFlow's lists, ``miniflow.amp.lists``); it is copied.
            white_add ... clear_add: op type names to put in that list (out of any other).
            white_remove ... clear_remove: op type names to take out of that list (unlisted).
            loss_scale_policy: ``"fp32"`` (default: the autograd pass puts ``amp_black_identity``
                on the initial gradient so the loss-gradient path stays float32), ``"cast_back"``
                (OneFlow PR 9126) or ``"legacy"`` (OneFlow before it); see
                ``miniflow.passes.loss_scale``.

        Raises:
            TypeError: ``mode`` is not a bool, ``lists`` not an AmpLists, ``dtype`` not a half
                type.
            ValueError: an unknown op type name, or one that is not in the list it is removed
                from; an unknown loss_scale_policy.
        """
        boolean("enable_amp", "mode", mode)
        if lists is not None and not isinstance(lists, AmpLists):
            raise TypeError(f"enable_amp: lists must be a miniflow.amp.AmpLists, got "
                            f"{type(lists).__name__} (or use white_add=..., black_add=...)")
        if loss_scale_policy not in POLICIES:
            raise ValueError(f"enable_amp: unknown loss_scale_policy {loss_scale_policy!r}; choose "
                             f"one of {', '.join(map(repr, POLICIES))}")
        self.version += 1
        self.loss_scale_policy = loss_scale_policy
        if not mode:
            self.amp = None
            return
        lists = (AmpLists() if lists is None else lists).with_changes(
            add={"white": white_add, "black": black_add, "gray": gray_add, "clear": clear_add},
            remove={"white": white_remove, "black": black_remove, "gray": gray_remove,
                    "clear": clear_remove})
        self.amp = AmpConfig(lists, dtype)

    def enable_fused_model_update_cast(self, mode: bool = True) -> None:
        """Under AMP, fuse the optimizer updates with the weights' half casts and the gradients'
        unscaling (OneFlow's ``enable_fused_model_update_cast`` and
        ``enable_multi_tensor_update``; here on by default): one multi-tensor update per
        optimizer reads the backward's gradients, unscales, updates the float32 master weights
        and writes their half copies, which the next step's matmuls read; the non-finite count
        moves into the matmuls that make the gradients. The same bits as the unfused graph
        (``miniflow.passes.fuse_model_update_cast``). ``False`` keeps the separate casts and
        unscaling (the stability study reads the unscaled gradients). Recompiles.

        Raises:
            TypeError: ``mode`` is not a bool.
        """
        boolean("enable_fused_model_update_cast", "mode", mode)
        self.fused_model_update_cast = mode
        self.version += 1

    def enable_data_parallel(self, enabled: bool = True, *,
                             bucket_cap_mb: float = distributed.DEFAULT_BUCKET_CAP_MB) -> None:
        """Average the gradients across the ranks of the process world (``miniflow.distributed``),
        or not (``enabled=False``).

        Without this call a graph that trains is data parallel whenever the world has more than
        one rank (``mpiexec -n 2 python train.py``): ranks that train apart would drift apart
        silently. ``enable_data_parallel(False)`` trains each rank on its own;
        ``enable_data_parallel(True)`` in a one-process world keeps the ``all_reduce`` nodes
        (the identity there), e.g. to read the IR.

        Args:
            enabled: True or False.
            bucket_cap_mb: the gradient bucket size in MiB (PyTorch DDP's ``bucket_cap_mb``).

        Raises:
            TypeError: ``enabled`` is not a bool.
            ValueError: ``bucket_cap_mb`` is not a finite number > 0.
        """
        boolean("enable_data_parallel", "enabled", enabled)
        self.data_parallel = DataParallelConfig(bucket_cap_mb)
        self.data_parallel_enabled = enabled
        self.version += 1

    # OneFlow's options miniflow has no use for (``python/oneflow/nn/graph/graph_config.py``).
    # Performance options of OneFlow that cannot change what is computed are recorded in
    # ``performance_hints`` and do nothing; the others are refused unless off.
    def _hint(self, method: str, mode) -> None:
        """Record OneFlow's performance option ``method(mode)`` (a bool), which changes nothing
        here."""
        boolean(method, "mode", mode)
        self.performance_hints[method] = mode

    def _refuse_on(self, method: str, mode, why: str) -> None:
        """``method(False)`` is what miniflow does (recorded); ``method(True)`` raises ValueError
        with ``why``."""
        if mode is True:
            raise ValueError(f"{method}(True): {why}")
        self._hint(method, mode)

    def allow_fuse_cast_scale(self, mode: bool = True) -> None:
        """OneFlow's option to fuse a cast with the ``scalar_mul_by_tensor`` after it (a
        performance option: the same cast and product in one kernel). A no-op: miniflow's
        ``fuse_elementwise`` pass always fuses them (the gradients' cast and unscale under AMP),
        with the same bits as unfused.

        Raises:
            TypeError: ``mode`` is not a bool.
        """
        self._hint("allow_fuse_cast_scale", mode)

    def allow_fuse_model_update_ops(self, mode: bool = True) -> None:
        """OneFlow's option to fold the gradient's cast, scale and L1/L2 regularization into the
        model update op (a performance option: the same update in one kernel). A no-op:
        miniflow's update ops already apply the weight decay, and under AMP
        :meth:`enable_fused_model_update_cast` (on by default) fuses the cast and unscaling.

        Raises:
            TypeError: ``mode`` is not a bool.
        """
        self._hint("allow_fuse_model_update_ops", mode)

    def enable_multi_tensor_update(self, mode: bool = True) -> None:
        """OneFlow's option to merge the per-parameter update kernels into multi-tensor ones (a
        performance option: the same update per element). A no-op: under AMP miniflow's
        multi-tensor updates are :meth:`enable_fused_model_update_cast`'s (on by default).

        Raises:
            TypeError: ``mode`` is not a bool.
        """
        self._hint("enable_multi_tensor_update", mode)

    def enable_compress_memory(self, mode: bool = True) -> None:
        """OneFlow's search for a smaller memory allocation (where buffers live, not what is
        computed). A no-op: a miniflow plan allocates its buffers its own way.

        Raises:
            TypeError: ``mode`` is not a bool.
        """
        self._hint("enable_compress_memory", mode)

    def enable_choose_best_memory_allocation(self, mode: bool = True) -> None:
        """OneFlow's choice among its memory allocation algorithms (where buffers live, not what
        is computed). A no-op, as :meth:`enable_compress_memory`.

        Raises:
            TypeError: ``mode`` is not a bool.
        """
        self._hint("enable_choose_best_memory_allocation", mode)

    def enable_straighten_algorithm(self, mode: str = "MemoryFirst") -> None:
        """OneFlow's ordering of its task graph (``"Disable"``, ``"SpeedFirst"``,
        ``"MemoryFirst"``, ``"OverlapCpuGpu"``, ``"DelayShortGpu"``): the order ops run in, not
        what they compute. A no-op: a miniflow plan runs its nodes in the IR's order.

        Raises:
            ValueError: ``mode`` is not one of OneFlow's names.
        """
        modes = ("Disable", "SpeedFirst", "MemoryFirst", "OverlapCpuGpu", "DelayShortGpu")
        if mode not in modes:
            raise ValueError(f"enable_straighten_algorithm: mode must be one of "
                             f"{', '.join(map(repr, modes))}, got {mode!r}")
        self.performance_hints["enable_straighten_algorithm"] = mode

    def set_outputs_buffer_size(self, value: int = 2) -> None:
        """OneFlow's number of calls whose outputs may be pending at once (a pipeline depth; the
        outputs are the same). A no-op: a miniflow call returns its outputs finished.

        Raises:
            ValueError: ``value`` is not an integer >= 1 (OneFlow's check).
        """
        self.performance_hints["set_outputs_buffer_size"] = integer("set_outputs_buffer_size",
                                                                    "value", value, 1)

    def allow_fuse_add_to_output(self, mode: bool = True) -> None:
        """OneFlow's option to fold an add into the op that makes one of its inputs (conv,
        matmul, batch norm write ``x + y`` at once: a half sum is then rounded once, not twice,
        so results can change). miniflow does not: ``False`` (OneFlow's default) is accepted.

        Raises:
            TypeError: ``mode`` is not a bool. ValueError: ``mode`` is True.
        """
        self._refuse_on("allow_fuse_add_to_output", mode, "miniflow does not fold an add into the "
                        "op before it; remove the call (the add runs as its own elementwise op)")

    def enable_zero(self, mode: bool = True, *, stage: int = 2, shard_min_size: int = 1024,
                    shard_restore_level: int = 1) -> None:
        """OneFlow's ZeRO: optimizer state sharded across the data-parallel ranks. miniflow keeps
        the whole state on every rank: ``enable_zero(False)`` is accepted.

        Raises:
            ValueError: ``mode`` is True (TypeError: not a bool).
        """
        self._refuse_on("enable_zero", mode, "miniflow has no ZeRO (every rank keeps the whole "
                        "optimizer state); remove the call")

    def enable_auto_parallel(self, mode: bool = True) -> None:
        """OneFlow's search for a parallel (SBP) strategy. miniflow's only parallelism is data
        parallel (:meth:`enable_data_parallel`): ``enable_auto_parallel(False)`` is accepted.

        Raises:
            TypeError: ``mode`` is not a bool. ValueError: ``mode`` is True.
        """
        self._refuse_on("enable_auto_parallel", mode, "miniflow has no auto parallel; remove the "
                        "call (data parallel is config.enable_data_parallel)")

    def enable_cudnn_conv_heuristic_search_algo(self, mode: bool = True) -> None:
        """OneFlow's choice of how cuDNN picks a convolution algorithm (algorithms whose results
        can differ in the last bits). Refused: miniflow has no cuDNN.

        Raises:
            ValueError: always.
        """
        raise ValueError(f"enable_cudnn_conv_heuristic_search_algo({mode!r}): miniflow has no "
                         "cuDNN (one convolution algorithm per backend); remove the call")


def compile_settings(config: GraphConfig, optimizers: list, grad_scaler, param_names: dict,
                     owner: str) -> CompileSettings:
    """The settings the passes read for one compile of the graph named ``owner``.

    Args:
        config: the graph's :class:`GraphConfig`.
        optimizers: the graph's optimizers, in order (their parameters whose ``requires_grad``
            is True are trained: a frozen parameter gets no gradient op and no update).
        grad_scaler: the graph's loss scaler, or None.
        param_names: ``id(parameter) -> variable name`` of every parameter of the graph's
            module attributes.
        owner: the graph's class name, for the error message.

    Raises:
        ValueError: an optimizer's parameter is no parameter of the graph's module attributes,
            or is also trained by another optimizer of the graph (a group added with
            ``add_param_group`` after ``add_optimizer``: its update would run twice).
    """
    _check_optimizer_params(optimizers, param_names, owner)
    trainable = [param_names[id(p)] for opt in optimizers for p in opt.params
                 if p.requires_grad]  # a frozen parameter: no gradient op, no update
    policy = config.loss_scale_policy
    identity = "amp_black_identity" if config.amp and policy == "fp32" else None
    return CompileSettings(
        trainable=trainable, optimizers=optimizers, param_names=param_names,
        amp=config.amp, grad_scaler=grad_scaler, loss_scale_policy=policy,
        initial_grad_identity=identity, data_parallel=_data_parallel(config, trainable),
        print_ir=config.print_ir, accumulation_steps=config.gradient_accumulation_steps,
        fuse_model_update_cast=config.fused_model_update_cast)


def _check_optimizer_params(optimizers: list, param_names: dict, owner: str) -> None:
    """Raise ValueError unless every parameter of ``optimizers`` (all their param groups) is a
    parameter of the graph ``owner``'s module attributes, trained by one optimizer only."""
    seen = set()
    for opt in optimizers:
        if seen & {id(p) for p in opt.params}:   # a group added after add_optimizer
            raise ValueError(f"{owner}: a parameter of {type(opt).__name__} is also trained by "
                             "another optimizer of the graph (its update would run twice)")
        seen.update(id(p) for p in opt.params)
        for i, p in enumerate(opt.params):
            if id(p) not in param_names:
                raise ValueError(
                    f"{type(opt).__name__} parameter {i} ({p.dtype.short}{list(p.shape)}) is "
                    f"not a parameter of a module attribute of {owner}: assign "
                    "its module to the graph (self.model = model) so the graph can train it "
                    "(modules kept in plain lists or dicts are not found); or the module holds "
                    "a new Parameter in its place, assigned after the optimizer was made (as "
                    "nanoGPT's crop_block_size replaces wpe.weight): make the optimizer "
                    "after that")


def _data_parallel(config: GraphConfig, trainable: list) -> DataParallelConfig | None:
    """The data-parallel settings if the graph averages its gradients across the ranks: it
    trains, and ``config.enable_data_parallel`` said so or (not called) the world has more
    than one rank (set up here: ``distributed.init()``, a one-rank world without a
    launcher)."""
    enabled = config.data_parallel_enabled
    if not trainable or enabled is False:
        return None
    distributed.init()
    if enabled is None and distributed.world_size() == 1:
        return None
    return config.data_parallel
