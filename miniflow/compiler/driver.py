"""The compile driver: ``nn.Graph``, OneFlow's lazy-graph API (``oneflow.nn.Graph``);
re-exported as ``miniflow.nn.Graph``.

It sits above every other layer (modules, optimizers, AMP, passes, runtime): tracing ``build`` with
``miniflow.trace``, running ``miniflow.passes.pipeline`` with ``CompileSettings`` made from the
graph's configuration, optimizers and scaler (``miniflow.compiler.config``), and building
``miniflow.runtime.plan`` plans, whose half weight copies ``miniflow.compiler.half_copies`` keeps.

Data parallel (``miniflow.distributed``, MPI): a graph that trains, started by ``mpiexec -n N``
with N > 1, averages its gradients across the ranks (the ``data_parallel`` pass: ``all_reduce``
nodes), unless ``config.enable_data_parallel(False)`` turns it off. Every time such a graph compiles
the ranks check that they compiled the same graph (:class:`miniflow.distributed.RankMismatchError`
on every rank otherwise) and take rank 0's parameters, optimizer state and loss scale (an MPI
broadcast), so every replica starts equal. Every later call first agrees, in one small all-reduce
that also checks the learning rates, on whether the ranks recompile and which plan they run: a
rank that would recompile alone (a change made on it only, e.g. ``load_state_dict``) or run
another plan (``eval()`` on it only) makes every rank raise ``RankMismatchError`` instead of
waiting in other collectives than the rest (or stepping differently). Graphs without an
optimizer (evaluation) stay local: rank 0 may run one alone.

Subclass it, assign modules as attributes, call ``self.add_optimizer(opt)`` and implement
``build(*inputs)``. The graph trains the optimizers' parameters whose ``requires_grad`` is True
(PyTorch's freezing: a frozen parameter gets no gradient op and no update; changing the flag
recompiles); a loss that depends on none of them is an error when the graph compiles, as
PyTorch's ``backward`` raises. The first call with a new input signature (shapes and dtypes) and a
new combination of its modules' modes (``Module.train()`` / ``eval()``: batch norm traces
differently in each) traces ``build`` into an IR graph, runs the pass pipeline and builds a plan;
later calls with that signature and those modes only copy the inputs in and run the plan. Up to
:attr:`Graph.max_plans` plans are kept (least recently used evicted). Parameters and optimizer
state are graph variables shared by every plan. Every plan is dropped, and the next call
recompiles, after a change of the graph's configuration, modules, optimizers (their
hyper-parameters) or scaler, or of any module's traced attributes (``Module.version.traced``),
or an assignment of any attribute of one of the graph's modules (``dropout.p = 0.5``,
``layer_norm.eps``, ``bn.momentum``, a plain attribute a custom ``forward`` reads:
``Module.compiled_into``), as ``torch.compile`` recompiles when such an attribute changes. Only
the graphs holding the module (as an attribute or inside one) recompile; assigning an equal number
again, or ``training`` (plans are kept per mode), does not. So does assigning a new value to an
attribute of the graph itself that ``build`` read when it was traced (``self.temperature = 2.0``:
:meth:`Graph._recording_reads`); an attribute ``build`` never read (a step counter) recompiles
nothing.

Calls of one graph instance are serialized by a lock: a plan owns one set of input, intermediate
and output buffers, and the scaler counts one step at a time, so two threads calling the same graph
take turns (each gets its own result). Different graph instances have separate locks: graphs that
share modules, optimizers or a scaler must not be called concurrently (their updates would
interleave), as with PyTorch modules.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import zlib
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np

from .. import distributed
from ..amp.grad_scaler import GradScaler, StaticGradScaler
from ..amp.report import AmpReport, amp_report as build_amp_report
from ..checkpoint import restore_as
from ..dtype import as_dtype, graph_dtype
from ..ir import Graph as IRGraph
from ..nn.dropout import dropout_state
from ..nn.module import Module, same_value
from ..ops import emitter
from ..optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from ..optim.optimizer import Optimizer
from ..passes.auto_mixed_precision import AmpState
from ..passes.data_parallel import DataParallelState
from ..passes.loss_scale import LossScaleState
from ..passes.pipeline import (AMP_PASSES, DATA_PARALLEL_PASSES, STAGE_ALIASES, CompileContext,
                               passes_for, run_passes)
from ..runtime.backend import get_backend
from ..runtime.plan import Plan
from ..runtime.readback import LEDGER
from ..tensor import Tensor, tensor
from ..trace import Tracer, current_tracer
from .config import GraphConfig, compile_settings
from .half_copies import HalfCopies, rounded_copies
from .outputs import flatten, rebuild

__all__ = ["Graph", "GraphConfig"]


def _recompiles_alone(name: str, flags: list) -> str:
    """The message of :meth:`Graph._agree_on_compiling` for ``flags``: per rank, whether it
    recompiles ``name`` at this call (some do, some not)."""
    ranks = [r for r, f in enumerate(flags) if f]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return (f"{name} recompiles at this call on {who} only (of {len(flags)} ranks): since the "
            f"last call something that recompiles a graph changed there alone (a "
            f"load_state_dict of the graph, a module or an optimizer; add_param_group or an "
            f"optimizer's hyper-parameter; an attribute of a module the graph traced, such as "
            f"dropout.p; train() / eval(); requires_grad; the graph's config; a batch of "
            f"another shape). Compiling is collective (the ranks compare their graphs and take "
            f"rank 0's variables), so the ranks would wait in different collectives: every rank "
            f"must make the same change (load_state_dict on every rank, with the same state "
            f"dict).")


@functools.lru_cache(maxsize=256)
def _digest(key: tuple) -> float:
    """A plan's key as a number that is the same in every process (``hash`` of a str is not:
    ``PYTHONHASHSEED``), for :meth:`Graph._agree_on_compiling`'s all-reduce."""
    return float(zlib.crc32(repr(key).encode()))


def _key_text(key: tuple) -> str:
    """A plan's key (:meth:`Graph._run`: per input ``(shape, dtype.str)``, then the modules'
    ``training`` flags) as text: ``inputs (64, 64) <f4, (64,) <i8; modes train``."""
    *inputs, modes = key
    mode = "train" if all(modes) else "eval" if not any(modes) else "mixed train/eval"
    return ("inputs " + ", ".join(f"{tuple(s)} {d}" for s, d in inputs) + f"; modes {mode}")


def _record_outcome(scaler, skip_nonfinite: bool, optimizers, names, hosts) -> None:
    """A step's outcome read back (``hosts``: the scale it started from, its non-finite counts):
    the optimizers count the step (skipped or not), the scaler records it (and may raise
    ``NonFiniteGradientsError``)."""
    scale_before, counts = float(hosts[0][0]), hosts[1]
    found = bool(counts.any())
    for opt in optimizers:
        opt._record_step(skip_nonfinite and found)
    scaler._record_step(counts, scale_before, names, found)


_INPUT_DTYPES: set = set()
"""The NumPy dtypes ``nn.Graph`` inputs were seen with and accepted (``graph_dtype``), so that the
next input of one is taken without asking again."""


class Graph:
    """Base class of lazily compiled models. See the module docstring."""

    max_plans = 8
    _name_counts: dict = {}   # class name -> graphs made (OneFlow's Graph._child_init_cnt)

    def __init__(self, *, enable_get_runtime_state_dict: bool = False, debug_v_level: int = -1,
                 debug_ranks=None, debug_max_py_stack_depth: int = 2,
                 debug_only_user_py_stack: bool = True,
                 debug_op_repr_with_py_stack: bool = False):
        """OneFlow's keywords (``python/oneflow/nn/graph/graph.py``): the ``debug_*`` ones are
        :meth:`debug`'s.

        Raises:
            ValueError: ``enable_get_runtime_state_dict=True`` (OneFlow's saved compiled
                runtime: miniflow recompiles from ``build``; save :meth:`state_dict`), or a
                ``debug_*`` value :meth:`debug` refuses.
        """
        if enable_get_runtime_state_dict:
            raise ValueError(f"{type(self).__name__}: enable_get_runtime_state_dict=True (a saved "
                             "compiled runtime) is not supported: miniflow recompiles from build; "
                             "save graph.state_dict() instead")
        self._traced_reads: set = set()     # see _recording_reads
        self._version = 0
        self._stamp = None
        cls = type(self).__name__
        count = Graph._name_counts[cls] = Graph._name_counts.get(cls, -1) + 1
        self._name = f"{cls}_{count}"
        self.config = GraphConfig()
        self._optimizers: list = []
        self._lr_schedulers: list = []   # (optimizer index, add_optimizer's lr_sch)
        self._plans: "OrderedDict[tuple, Plan]" = OrderedDict()
        self._ir: IRGraph | None = None
        self._context: CompileContext | None = None
        self.compile_count = 0
        self._grad_scaler = None
        self._modes_seen, self._mode_key = None, ()
        self._lr_count = None   # data parallel: see _agree_on_compiling
        self._lock = threading.RLock()  # one call at a time (see the module docstring)
        self.debug(debug_v_level, ranks=debug_ranks, max_py_stack_depth=debug_max_py_stack_depth,
                   only_user_py_stack=debug_only_user_py_stack,
                   op_repr_with_py_stack=debug_op_repr_with_py_stack)

    def __getattr__(self, name):
        """Only for attributes not found: a graph whose ``__init__`` did not call
        ``super().__init__()`` lacks what its methods and properties read (``_lock``,
        ``config`` ...); say so instead of naming the attribute.

        Raises:
            RuntimeError: ``Graph.__init__`` has not run (any name but a dunder).
            AttributeError: otherwise.
        """
        if "_plans" not in self.__dict__ and not name.startswith("__"):
            raise RuntimeError(f"{type(self).__name__}.__init__ must call super().__init__() "
                               "before anything else")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name, value):
        d = self.__dict__
        if "_version" in d and (isinstance(value, Module) or (
                name in d["_traced_reads"] and current_tracer() is None
                and not same_value(d.get(name), value))):
            self._version += 1  # a (re)assigned module, or a value build read: recompile
        object.__setattr__(self, name, value)

    @staticmethod
    @functools.cache
    def _recording_class(cls: type) -> type:
        """``cls`` with a ``__getattribute__`` that notes each public instance attribute read
        (other than a module) in ``_traced_reads``; a graph has this class while ``build`` is
        traced only (:meth:`_recording_reads`), so its calls pay nothing."""
        def __getattribute__(self, name):
            value = object.__getattribute__(self, name)
            if name[0] != "_" and not isinstance(value, Module):
                d = object.__getattribute__(self, "__dict__")
                if name in d:
                    d["_traced_reads"].add(name)
            return value
        return type(cls.__name__, (cls,), {"__getattribute__": __getattribute__,
                                           "_records_reads": True,
                                           "__qualname__": cls.__qualname__,
                                           "__module__": cls.__module__})

    @contextlib.contextmanager
    def _recording_reads(self):
        """Context in which the graph notes the attributes ``build`` reads (its class swapped
        for :meth:`_recording_class`), so that assigning one of them later recompiles, as
        ``torch.compile`` guards the attributes a compiled function read."""
        cls = type(self)
        if "_records_reads" in cls.__dict__:        # a build traced inside a build
            yield
            return
        object.__setattr__(self, "__class__", Graph._recording_class(cls))
        try:
            yield
        finally:
            object.__setattr__(self, "__class__", cls)

    def module_changed(self) -> None:
        """An attribute of a module this graph traced was assigned (:meth:`Module.compiled_into`):
        every plan is dropped at the next call, which recompiles."""
        self._version += 1

    def build(self, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must implement build(*inputs)")

    def __reduce_ex__(self, protocol):
        """``copy.copy``, ``copy.deepcopy`` and ``pickle`` all come here: refused, as a graph
        holds compiled plans, their buffers and a lock (OneFlow's ``nn.Graph`` is not copied
        either; PyTorch copies the ``nn.Module``)."""
        raise TypeError(f"an nn.Graph ({type(self).__name__}) cannot be copied or pickled; "
                        "copy the module (copy.deepcopy(model), or save its state_dict) and "
                        "build a new graph from it")

    def add_optimizer(self, optimizer, *, lr_sch=None, is_sparse: bool = False) -> None:
        """Train the optimizer's parameters with the loss marked by ``backward()`` in build, and
        with ``lr_sch`` (a scheduler of ``optimizer``) step its learning rate after every call
        that ran the updates, as OneFlow's ``nn.Graph.add_optimizer(optim, lr_sch=...)`` does
        (``oneflow/nn/graph/graph.py``; there the schedule is compiled into the job). A call
        whose update the grad scaler skipped does not advance it (``miniflow.optim.
        lr_scheduler``); with a grad scaler on cuda the step waits for the call's outcome, as a
        ``scheduler.step()`` after the call does. Do not step ``lr_sch`` by hand too: its
        ``step()`` raises RuntimeError while this graph exists (it would advance twice per
        update; OneFlow's graph does not follow an eager ``step()`` either).

        Raises:
            TypeError: not a ``miniflow.optim`` optimizer; ``lr_sch`` not a
                ``miniflow.optim.lr_scheduler`` scheduler.
            ValueError: the optimizer is already added, or shares a parameter with another one;
                ``lr_sch`` schedules another optimizer, or is a ``ReduceLROnPlateau`` (it needs
                the metric: call its ``step(metric)`` yourself); ``is_sparse=True`` (OneFlow's
                sparse update of embedding gradients, which miniflow does not have).
        """
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"add_optimizer: expected a miniflow.optim optimizer (SGD, Adam), got "
                            f"{type(optimizer).__name__}")
        if is_sparse:
            raise ValueError("add_optimizer: is_sparse=True (OneFlow's sparse update of embedding "
                             "gradients) is not supported: miniflow updates every parameter "
                             "densely; leave is_sparse=False")
        if lr_sch is not None:
            if not isinstance(lr_sch, LRScheduler):
                raise TypeError(f"add_optimizer: lr_sch must be a miniflow.optim.lr_scheduler "
                                f"scheduler, got {type(lr_sch).__name__}")
            if isinstance(lr_sch, ReduceLROnPlateau):
                raise ValueError("add_optimizer: lr_sch=ReduceLROnPlateau needs the metric it "
                                 "follows; call its step(metric) yourself once per epoch")
            if lr_sch.optimizer is not optimizer:
                raise ValueError(f"add_optimizer: lr_sch schedules another optimizer (a "
                                 f"{type(lr_sch.optimizer).__name__}); make it for this one")
        if any(o is optimizer for o in self._optimizers):
            raise ValueError("add_optimizer: this optimizer is already added (its update would "
                             "run twice)")
        mine = {id(p) for o in self._optimizers for p in o.params}
        if any(id(p) in mine for p in optimizer.params):
            raise ValueError("add_optimizer: a parameter of this optimizer is already trained by "
                             "another optimizer of the graph")
        self._optimizers.append(optimizer)
        self.config._training = True   # OneFlow's config._train(True)
        if lr_sch is not None:
            self._lr_schedulers.append((len(self._optimizers) - 1, lr_sch))
            lr_sch._stepped_by(self)
        self._version += 1

    def set_grad_scaler(self, scaler) -> None:
        """Scale the loss with ``scaler`` (``miniflow.amp.GradScaler`` or ``StaticGradScaler``),
        with or without AMP; ``None`` removes it, and so does a disabled scaler
        (``GradScaler(enabled=False)``, which scales nothing, as PyTorch's: :attr:`grad_scaler`
        is then None). The graph recompiles at its next call.

        Raises:
            TypeError: not a miniflow grad scaler (nor None).
        """
        if scaler is not None and not isinstance(scaler, (GradScaler, StaticGradScaler)):
            raise TypeError(f"set_grad_scaler: expected miniflow.amp.GradScaler or "
                            f"StaticGradScaler, got {type(scaler).__name__}")
        self._grad_scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self._version += 1

    @property
    def name(self) -> str:
        """``<class name>_<n>``, the n-th graph of its class made in this process (OneFlow's
        ``nn.Graph.name``)."""
        return self._name

    @property
    def training(self) -> bool:
        """True once the graph has an optimizer (OneFlow's ``nn.Graph.training``: its config's;
        the modules' ``train()`` / ``eval()`` modes are theirs)."""
        return self.config.training

    @property
    def is_compiled(self) -> bool:
        """Whether the graph has been called (compiled) once (OneFlow's ``is_compiled``; a
        miniflow graph may compile again later, for a new input signature or setting)."""
        return self.compile_count > 0

    def debug(self, v_level: int = -1, *, ranks=None, max_py_stack_depth: int = 2,
              only_user_py_stack: bool = True, op_repr_with_py_stack: bool = False) -> None:
        """OneFlow's ``nn.Graph.debug`` (``python/oneflow/nn/graph/graph.py``; ``-1``, its
        default, closes debug mode). miniflow has one debug output, the IR after trace and after
        every pass (``config.debug``): any ``v_level`` from 0 to 3 turns it on, on ``ranks``
        (None: rank 0; an int or a list of ints; -1: every rank); -1 turns it off on every
        rank. It shows at the next compile.

        Raises:
            ValueError: ``v_level`` not an int in [-1, 3], ``ranks`` neither an int nor a list of
                ints, or a Python stack option off its default (miniflow's IR has no Python stack
                locations: leave ``max_py_stack_depth``, ``only_user_py_stack`` and
                ``op_repr_with_py_stack`` as they are).
        """
        if isinstance(v_level, bool) or not isinstance(v_level, int) or not -1 <= v_level <= 3:
            raise ValueError(f"debug: v_level must be an int from -1 (off) to 3, got {v_level!r}")
        if ranks is None:
            ranks = [0]
        elif isinstance(ranks, int) and not isinstance(ranks, bool):
            ranks = [ranks]
        if not (isinstance(ranks, list) and all(type(r) is int for r in ranks)):
            raise ValueError(f"debug: ranks must be an int or a list of ints, got {ranks!r}")
        stack = {"max_py_stack_depth": (max_py_stack_depth, 2),
                 "only_user_py_stack": (only_user_py_stack, True),
                 "op_repr_with_py_stack": (op_repr_with_py_stack, False)}
        for key, (value, default) in stack.items():
            if value != default or type(value) is not type(default):
                raise ValueError(f"debug: {key}={value!r}: miniflow's IR printout has no Python "
                                 f"stack locations; leave {key} at {default!r}")
        if v_level == -1:
            self.config.debug(False)
            return
        distributed.init()          # the world of this process (a world of one without mpiexec)
        if -1 in ranks or distributed.rank() in ranks:
            self.config.debug(True)

    # ------------------------------------------------------------------ state
    _OPTIMIZER_KEY, _SCHEDULER_KEY, _SCALER_KEY = ("System-Optimizer-{}", "System-LRScheduler-{}",
                                                   "System-GradScaler")

    def _stateful(self) -> dict:
        """``state dict key -> object`` of everything :meth:`state_dict` saves: the module
        attributes, the optimizers, their schedulers and the grad scaler."""
        parts = dict(self._modules())
        parts.update((self._OPTIMIZER_KEY.format(k), o) for k, o in enumerate(self._optimizers))
        parts.update((self._SCHEDULER_KEY.format(k), s) for k, s in self._lr_schedulers)
        if self._grad_scaler is not None:
            parts[self._SCALER_KEY] = self._grad_scaler
        return parts

    def state_dict(self, destination=None) -> dict:
        """The graph's whole training state (OneFlow's ``nn.Graph.state_dict``,
        ``python/oneflow/nn/graph/graph.py``): each module attribute's ``state_dict()`` under the
        attribute's name, as OneFlow's; then the optimizers' under ``"System-Optimizer-<k>"``,
        the schedulers of ``add_optimizer(lr_sch=)`` under ``"System-LRScheduler-<k>"`` (``k``:
        its optimizer's index, so a scheduler never loads into another's) and the
        grad scaler's under ``"System-GradScaler"`` (miniflow's keys: OneFlow saves its
        optimizers' state as tensors named after its job's variables). Copies, in NumPy;
        ``miniflow.save`` writes it. ``destination`` (a dict) is filled and returned.
        """
        out = OrderedDict() if destination is None else destination
        with self._lock:
            LEDGER.flush()   # the scaler's and optimizers' counts of pending steps
            for key, obj in self._stateful().items():
                out[key] = obj.state_dict()
        return out

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> None:
        """Load :meth:`state_dict`'s dict into the modules, optimizers, schedulers and scaler (in
        place, all or nothing: ``miniflow.checkpoint.restore_as``, its errors naming this method
        and the part, ``G.load_state_dict: state_dict['model']: ...``; OneFlow's
        ``nn.Graph.load_state_dict``). Unlike OneFlow, also after the first call: compiled plans
        read the loaded values. With ``strict=False`` a part missing from ``state_dict`` is left
        as it is, an unknown key is ignored, and the modules load with ``strict=False``.
        Data parallel (``mpiexec``): every rank must load the same dict (a load recompiles the
        graph, and every compile gives every rank rank 0's values). After the first call a load
        on one rank alone makes the next call raise ``miniflow.distributed.RankMismatchError``
        on every rank at once, naming the ranks that would recompile (the ranks agree on
        recompiling in the call's first collective: :meth:`_agree_on_compiling`); uncaught, it
        ends the job. Recompiling every rank instead would silently overwrite a load made on a
        rank other than 0 with rank 0's values.

        Raises:
            KeyError: (strict) a part missing or an unknown key, named; otherwise as the parts'
                ``load_state_dict`` (the message names the key).
        """
        if not isinstance(state_dict, dict):
            raise TypeError(f"{type(self).__name__}.load_state_dict: expected a dict (a graph's "
                            f"state_dict()), got {type(state_dict).__name__}")
        parts = self._stateful()
        unexpected = [k for k in state_dict if k not in parts]
        if strict and unexpected:
            raise KeyError(f"{type(self).__name__}.load_state_dict: unexpected keys {unexpected} "
                           f"(the graph has {list(parts)})")
        if not strict:   # restore's modules load with strict=False; missing parts are skipped
            parts = {k: SimpleNamespace(prepare_load_state_dict=functools.partial(
                         o.prepare_load_state_dict, strict=False)) if isinstance(o, Module) else o
                     for k, o in parts.items() if k in state_dict}
        with self._lock:
            LEDGER.flush()
            restore_as(state_dict, parts, f"{type(self).__name__}.load_state_dict", "state_dict")

    # ------------------------------------------------------------------ modules & names
    def _modules(self):
        return [(k, v) for k, v in vars(self).items() if isinstance(v, Module)]

    def named_parameters(self):
        """``(name, Parameter)`` for every module attribute, names prefixed by the attribute."""
        return self._named("named_parameters")

    def named_buffers(self):
        """``(name, buffer)`` for every module attribute's buffers (batch norm's running
        statistics ...), names prefixed by the attribute: graph variables, like parameters."""
        return self._named("named_buffers")

    def _named(self, method: str):
        """``(name, tensor)`` of ``Module.<method>`` over the module attributes, each tensor
        once (a module under two attributes is listed under the first)."""
        seen = set()
        for attr, m in self._modules():
            for name, t in getattr(m, method)(attr + "."):
                if id(t) not in seen:
                    seen.add(id(t))
                    yield name, t

    def __repr__(self) -> str:
        """OneFlow's ``(GRAPH:<name>:<class>): (...)`` with the config and each module attribute
        (``(MODULE:<attribute>): <module repr>``)."""
        if "_name" not in self.__dict__:   # __init__ did not call super().__init__()
            return object.__repr__(self)
        lines = [repr(self.config)] + [f"(MODULE:{k}): {m!r}" for k, m in self._modules()]
        body = "".join("\n  " + line.replace("\n", "\n  ") for line in lines)
        return f"(GRAPH:{self.name}:{type(self).__name__}): ({body}\n)"

    # ------------------------------------------------------------------ calling
    def __call__(self, *inputs, **named):
        """Run the graph on NumPy arrays (or eager Tensors); returns Tensor(s) as build returned.
        An input may be passed by the name of its parameter of ``build`` (``g(x, y=y)``, as
        OneFlow's ``__call__(*args, **kwargs)``); it is then the input at that position.

        Thread-safe: the whole call (recompiling, copying the inputs in, running the plan, cloning
        the outputs and the scaler's bookkeeping) holds this graph's lock, so concurrent calls of
        one graph run one after the other.

        Raises:
            TypeError: wrong number of inputs, or an unsupported dtype; a keyword that is no
                positional parameter of build, or that leaves an earlier one out (an input is
                an array: build's default cannot be one).
            ValueError/TypeError from op inference when build cannot trace with these inputs.
            RuntimeError: called from inside a build (nested graph calls), or ``__init__`` did
                not call ``super().__init__()``.
        """
        # without Graph.__init__ there is no _lock: __getattr__ names the missing call
        with self._lock:  # reentrant: a call from this graph's own build reaches the check below
            if current_tracer() is not None:
                raise RuntimeError(f"{type(self).__name__} was called inside another graph's "
                                   "build; nested nn.Graph calls are not supported: call its "
                                   "modules instead")
            return self._run(self._with_keywords(inputs, named) if named else inputs)

    def _with_keywords(self, inputs: tuple, named: dict) -> tuple:
        """``inputs`` followed by the ``named`` ones, each at its parameter's place in ``build``.

        Raises:
            TypeError: as :meth:`__call__`.
        """
        where = f"{type(self).__name__}.build"
        params = [p for p in inspect.signature(self.build).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        names = [p.name for p in params]
        only = {p.name for p in params if p.kind == p.POSITIONAL_ONLY}
        for key in named:
            if key in only or key not in names[len(inputs):]:
                why = ("is positional-only (before / in build's parameters): pass it by "
                       "position" if key in only else "is given twice" if key in names else
                       f"is not one of its positional parameters ({', '.join(names)})")
                raise TypeError(f"{where}: input {key!r} {why}")
        last = max(names.index(key) for key in named)
        gaps = [n for n in names[len(inputs):last] if n not in named]
        if gaps:
            raise TypeError(f"{where}: {', '.join(gaps)} not given, but a later input is: a "
                            "graph input is an array, not build's default; pass it too")
        return (*inputs, *(named[n] for n in names[len(inputs):last + 1]))

    def _run(self, inputs):
        """The body of :meth:`__call__`, under the lock."""
        scaler = self._grad_scaler
        stamp = (self._version, self.config.version, Module.version.traced,
                 scaler.version if scaler is not None else -1,
                 *(o.version for o in self._optimizers))
        if stamp != self._stamp:  # configuration, modules or hyper-parameters changed
            self._plans.clear()
            self._stamp = stamp
            self._modes_seen = None
        arrays = [self._as_array(i, x) for i, x in enumerate(inputs)]
        key = (*((a.shape, a.dtype.str) for a in arrays), self._modes())
        plan = self._plans.get(key)
        if plan.collective if plan is not None else self._lr_count is not None:
            self._agree_on_compiling(key, plan is None)     # data parallel: ranks call together
        if plan is None:
            plan = self._compile(arrays)
            self._plans[key] = plan
            if len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        plan.half_copies.refresh()
        counts = plan.graph.results.get("nonfinite_counts")
        if counts is None:
            outs = plan.run(arrays, to_host=False)  # copies of the output buffers
            plan.half_copies.stepped()
            if plan.updates:  # the updates ran: the optimizers count the step
                for opt in self._optimizers:
                    opt._record_step(False)
        else:  # the step's outcome is read back lazily (miniflow.runtime.readback)
            readback = self._scaler_readback(plan, scaler, counts)
            readback.copy(0)  # the scale the step starts from
            outs = plan.run(arrays, to_host=False)
            plan.half_copies.stepped()
            readback.copy(1)  # the non-finite counts
            readback.record()
            optimizers = tuple(self._optimizers) if plan.updates else ()
            LEDGER.defer(readback, functools.partial(
                _record_outcome, scaler, scaler.skip_nonfinite, optimizers,
                plan.context.state[LossScaleState].nonfinite_names))
        LEDGER.poll()
        if plan.updates:
            for _, scheduler in self._lr_schedulers:
                scheduler._scheduled_step()
        return rebuild(plan.output_structure, [Tensor(o) for o in outs])

    def _modes(self) -> tuple:
        """The ``training`` flags of every module of the graph, in order: part of a plan's key,
        so a plan is compiled for each mode seen (train and eval plans are both kept). Computed
        again only after some module's mode changed (``Module.version.modes``)."""
        seen = Module.version.modes
        if self._modes_seen != seen:
            self._mode_key = tuple(m.training for _, top in self._modules()
                                   for m in top.modules())
            self._modes_seen = seen
        return self._mode_key

    @staticmethod
    def _scaler_readback(plan: Plan, scaler, counts):
        """The next of ``plan``'s read-backs of (scale, non-finite counts), a ring of
        ``backend.readback_depth``; when it is still pending, the ledger is flushed first (so at
        most that many steps are pending per plan)."""
        ring = plan.state.get("scaler_readbacks")
        if ring is None:
            arrays = [scaler._scale, plan.buffers[counts]]
            ring = plan.state["scaler_readbacks"] = [
                [plan.backend.readback(arrays) for _ in range(plan.backend.readback_depth)], 0]
        slots, k = ring
        ring[1] = (k + 1) % len(slots)
        if slots[k].pending:
            LEDGER.flush()
        return slots[k]

    @staticmethod
    def _as_array(i: int, x) -> np.ndarray:
        if type(x) is np.ndarray and x.flags.c_contiguous and x.dtype in _INPUT_DTYPES:
            return x                        # the common case, checked in 0.2 us
        if isinstance(x, Tensor):
            x = x.numpy()
        if x is None:
            raise TypeError(f"graph input {i} is None: every input is an array or a Tensor "
                            "(OneFlow's None inputs are not supported; leave it out of build)")
        try:
            if not isinstance(x, np.ndarray):  # lists, scalars: float32 / int64, as miniflow.tensor
                x = tensor(x).numpy()
        except (TypeError, ValueError) as e:
            raise TypeError(f"graph input {i}: {e} (a {type(x).__name__})") from None
        arr = np.asarray(x, order="C")     # not ascontiguousarray: it makes a 0-d input [1]
        try:
            graph_dtype(arr.dtype)
        except TypeError as e:
            raise TypeError(f"graph input {i}: {e}") from None
        _INPUT_DTYPES.add(arr.dtype)
        return arr

    def _compile(self, arrays) -> Plan:
        """Trace, run the passes and build a plan (its ``context``: the passes' CompileContext)."""
        graph, ctx, structure = self._trace(arrays)
        graph = run_passes(graph, ctx)
        if graph.loss is not None and self._optimizers and not graph.grads:
            raise RuntimeError(
                f"{type(self).__name__}.build: the loss depends on no trainable parameter: every "
                f"parameter of the graph's optimizers that it depends on has requires_grad=False "
                f"(or none reaches it), so backward() has nothing to differentiate (PyTorch's "
                f"backward raises here too); unfreeze one (p.requires_grad_(True)) or leave "
                f"backward() and the optimizer out of this graph")
        copies = HalfCopies(graph, ctx, dict(self.named_parameters()), get_backend())
        buckets = getattr(ctx.state.get(DataParallelState), "buckets", None)
        collective = bool(buckets) and distributed.world_size() > 1
        if collective:
            self._sync_ranks(graph, ctx)
            self._check_learning_rates()
            copies.stale()
        if collective:
            self._lr_count = len(self._learning_rates())
        self._ir, self._context = graph, ctx
        self.compile_count += 1
        plan = Plan(graph, get_backend(), context=ctx, collective=collective)
        plan.half_copies = copies
        plan.updates = bool(graph.grads)    # whether a step runs the updates (not per call)
        plan.collective = collective        # data parallel: the ranks step together
        plan.output_structure = structure   # what build returned: a call returns the same
        return plan

    def stages(self, *inputs) -> list:
        """The names of the IR's stages for these example inputs, in order: ``"trace"`` (the IR
        ``build`` records), then every pass that runs for this graph
        (``miniflow.passes.pipeline.passes_for``: the AMP passes only with AMP enabled ...).

        Raises:
            TypeError / ValueError: as :meth:`__call__`, when build cannot trace these inputs.
        """
        with self._lock:
            _, ctx, _ = self._trace([self._as_array(i, x) for i, x in enumerate(inputs)])
        return ["trace"] + [name for name, _ in passes_for(ctx)]

    def lower(self, *inputs, after: str | None = None) -> IRGraph:
        """The IR of ``build`` traced with the example ``inputs`` (arrays or Tensors, as for a
        call), after pass ``after`` of the pipeline: a fresh graph, compiled for nothing (no plan
        is built, :attr:`ir` is unchanged, nothing runs). ``after`` is ``"trace"`` (no pass), a
        pass name of :meth:`stages` (``"autograd"``, ``"auto_mixed_precision"`` or its short name
        ``"amp"`` ...), or None: every pass (the IR a call runs). The variables' data are the
        modules' and optimizers' own arrays (read them, do not write them); the half weight
        copies of ``fuse_model_update_cast``, each parameter rounded now, arrays of their own.

        Raises:
            ValueError: ``after`` is no stage of this graph (naming the stages, and saying why
                a known pass does not run: AMP off, no data parallel).
            TypeError / ValueError: as :meth:`__call__`, when build cannot trace these inputs.
        """
        stage = STAGE_ALIASES.get(after, after)
        with self._lock:
            graph, ctx, _ = self._trace([self._as_array(i, x) for i, x in enumerate(inputs)])
            passes = passes_for(ctx)
            names = ["trace"] + [name for name, _ in passes]
            if stage is not None and stage not in names:
                why = ""
                if stage in AMP_PASSES:
                    why = f" ({stage} runs only with AMP: self.config.enable_amp())"
                elif stage in DATA_PARALLEL_PASSES:
                    why = (f" ({stage} runs only for a data-parallel training graph: "
                           "config.enable_data_parallel(True))")
                raise ValueError(f"{type(self).__name__}.lower: after={after!r} is no stage of "
                                 f"this graph{why}; choose one of {', '.join(names)}")
            if stage is not None:
                passes = passes[:names.index(stage)]
            graph = run_passes(graph, ctx, passes)
            rounded_copies(graph, ctx, dict(self.named_parameters()))
            return graph

    def _trace(self, arrays):
        """Trace ``build`` on ``arrays`` into a new IR graph; returns it, the CompileContext
        the passes will share, and the structure of what ``build`` returned (``outputs``: a
        plan's call returns the same; per plan, as ``build`` may return otherwise per signature
        or mode)."""
        names = self._input_names(len(arrays))
        graph = IRGraph()
        emit = emitter(graph)
        micro = self.config.gradient_accumulation_steps
        param_names = {id(p): name for name, p in self.named_parameters()}
        buffer_names = {id(b): name for name, b in self.named_buffers()}
        tracer = Tracer(graph, {**buffer_names, **param_names})
        with tracer:
            lazy = []
            for name, a in zip(names, arrays):
                v = graph.add_input(name, a.shape, as_dtype(a.dtype))
                if micro > 1:  # OneFlow's GradAccTryInsertUnpackAfterInput
                    if a.ndim == 0 or a.shape[0] % micro:
                        raise ValueError(
                            f"{type(self).__name__}: input {name!r} has shape {list(a.shape)}, "
                            f"but set_gradient_accumulation_steps({micro}) splits every input "
                            f"along dim 0 into {micro} equal micro-batches: pass a dim 0 that is "
                            f"a multiple of {micro}")
                    v = emit("unpack", v, unpack_num=micro)
                lazy.append(Tensor(_value=v, _tracer=tracer))
            with self._recording_reads():
                out = self.build(*lazy)
        Module.compiled_into((m for _, top in self._modules() for m in top.modules()), self)
        outs, structure = flatten(out, lambda o: isinstance(o, Tensor))
        values = [tracer.value_of(o) for o in outs]
        if micro > 1:  # OneFlow's GradAccTryInsertPackBeforeOutput
            values = [emit("pack", v, pack_num=micro) for v in values]
        graph.set_outputs(values)
        if graph.loss is None and self._optimizers:
            raise RuntimeError("this graph has an optimizer but build never called loss.backward()")
        return graph, CompileContext(compile_settings(self.config, self._optimizers,
                                                      self._grad_scaler, param_names,
                                                      type(self).__name__)), structure

    def _sync_ranks(self, graph: IRGraph, ctx: CompileContext) -> None:
        """Check that every rank compiled the same graph, then give every rank rank 0's variables
        (parameters, optimizer state, loss scale): collective, at every compile. The dropout
        stream stays each rank's own, as PyTorch's DDP never syncs a random generator: ranks
        seeded apart (nanoGPT's ``manual_seed(1337 + rank)``) draw their own masks.

        Raises:
            RankMismatchError: on every rank, when the ranks' trained parameters (names, shapes,
                dtypes) or compiled graphs differ, naming the first difference.
        """
        name = type(self).__name__
        params = "\n".join(f"{n} {graph.variables[n].type_str}" for n in ctx.settings.trainable)
        distributed.check_same_across_ranks(params, f"trained parameters of {name}")
        distributed.check_same_across_ranks(str(graph), f"compiled graphs of {name} (the "
                                            f"printed IR: inputs, variables, nodes)")
        backend = get_backend()
        stream = dropout_state()._data
        arrays = [graph.variable_data[n] for n in sorted(graph.variables)]
        arrays = [a for a in arrays if a is not stream]
        hosts = [a if isinstance(a, np.ndarray) else backend.to_numpy(a) for a in arrays]
        fn, args = distributed.broadcast_step(hosts, root=0)
        fn(*args)
        for a, h in zip(arrays, hosts):
            if a is not h:
                backend.copy_in(a, h)

    def _learning_rates(self) -> list:
        """Every param group's lr, optimizer after optimizer (read at every step)."""
        return [group["lr"] for opt in self._optimizers for group in opt._groups]

    def _check_learning_rates(self) -> None:
        """Data parallel, at every compile: check that every rank steps with the same learning
        rates (the calls between compiles check them in :meth:`_agree_on_compiling`). An lr is
        read from its array at every step, not compiled into the graph that :meth:`_sync_ranks`
        compares; set on one rank only (by hand, or by a scheduler stepped on one rank), it would
        make the replicas drift apart. Collective (one small all-reduce,
        ``distributed.check_same_values``).

        Raises:
            RankMismatchError: on every rank, naming the first group whose lr differs.
        """
        distributed.check_same_values(
            self._learning_rates(),
            lambda: [f"optimizer {k} group {g} lr" for k, opt in enumerate(self._optimizers)
                     for g in range(len(opt._groups))],
            f"learning rates of {type(self).__name__}",
            "Every rank must set them alike: by the same scheduler, stepped on every rank, or "
            "by hand on every rank.")

    def _agree_on_compiling(self, key: tuple, compiling: bool) -> None:
        """Data parallel, the first collective of every call of a data-parallel plan (or one
        that compiles, once the graph has compiled one): one small all-reduce
        (``distributed.same_values``) of whether this rank compiles at this call, of a digest of
        the plan's ``key`` (the inputs' shapes and dtypes, the modules' train/eval modes) and of
        the learning rates, the check every step makes anyway, so a call costs no extra
        collective. Ranks whose keys differ would run different plans (a smaller last batch on
        one rank, ``eval()`` on one rank): every rank raises too.

        Compiling is collective (:meth:`_sync_ranks`); so is a step (the gradient all-reduces).
        A rank that recompiles alone, after a change made on it only, would wait in the compile's
        collectives while the others wait in their step's, until the watchdog aborted the job
        (``MINIFLOW_DIST_TIMEOUT``); agreeing first makes every rank raise at once instead.
        Recompiling every rank instead would not keep the change: the compile gives every rank
        rank 0's variables (a load on rank 1 alone would be lost), and a graph changed on one
        rank alone is an error there anyway. A compiling rank sends zeros for its learning rates
        (MPI needs equal counts: as many as every rank sent at the last call,
        ``self._lr_count``; its own groups may have changed), which the compile checks instead.

        Raises:
            RankMismatchError: on every rank, naming the ranks that would recompile alone, or
                every rank's inputs and modes where the keys differ, or
                (:meth:`_check_learning_rates`) the first group whose lr differs.
        """
        lrs = [0.0] * self._lr_count if compiling else self._learning_rates()
        name = type(self).__name__
        if distributed.same_values([float(compiling), _digest(key), *lrs],
                                   f"the per-call check of {name}"):
            return
        flags = distributed.all_gather_object((compiling, key), f"recompiling {name}")
        if any(f for f, _ in flags):
            raise distributed.RankMismatchError(_recompiles_alone(name, [f for f, _ in flags]))
        if any(k != key for _, k in flags):
            raise distributed.RankMismatchError(
                f"{name} is called with other inputs or module modes on some ranks: "
                + "; ".join(f"rank {r}: {_key_text(k)}" for r, (_, k) in enumerate(flags))
                + ". Every rank must call a data-parallel graph with inputs of the same shapes "
                "and dtypes (a last, smaller batch dropped on every rank or on none) and its "
                "modules in the same train() / eval() modes.")
        self._check_learning_rates()      # the learning rates differ: name the first

    def _input_names(self, n: int) -> list:
        """Names of the first ``n`` inputs of ``build`` (``input<i>`` for ``*args``).

        Raises:
            TypeError: too few inputs for build's required parameters, or too many.
        """
        params = [p for p in inspect.signature(self.build).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in params if p.default is p.empty]
        varargs = any(p.kind == p.VAR_POSITIONAL
                      for p in inspect.signature(self.build).parameters.values())
        if n < len(required) or (n > len(params) and not varargs):
            takes = (f"{len(required)} to {len(params)}" if len(required) != len(params)
                     else str(len(params)))
            raise TypeError(f"{type(self).__name__}.build takes {takes} input(s) "
                            f"({', '.join(p.name for p in params)}), got {n}")
        return [p.name for p in params[:n]] + [f"input{i}" for i in range(len(params), n)]

    def amp_report(self) -> AmpReport:
        """What AMP decided for the last compiled plan: per node its color, dtype and the rule or
        neighbour that decided it; counts of float16 nodes, float32 nodes and inserted casts.

        Raises:
            RuntimeError: AMP is not enabled, or the graph has not been called (compiled) yet.
        """
        state = None if self._context is None else self._context.state.get(AmpState)
        if state is None:
            raise RuntimeError(f"{type(self).__name__}.amp_report(): no AMP decisions yet; enable "
                               "AMP (self.config.enable_amp()) and call the graph once")
        return build_amp_report(state, self._ir)

    @property
    def ir(self) -> IRGraph:
        """The IR of the most recently compiled plan (``print(g.ir)``, ``g.ir.to_dot(path)``).

        Raises:
            RuntimeError: the graph has not been called yet, so nothing is compiled.
        """
        return self._compiled(self._ir, "ir")

    @property
    def compile_context(self) -> CompileContext:
        """What the passes recorded for the most recently compiled plan (the
        :class:`~miniflow.passes.pipeline.CompileContext`: its ``settings`` and the passes'
        ``state``, e.g. ``state[AutogradState].initial_grad``, ``state[AmpState]``; every plan
        keeps its own as ``plan.context``).

        Raises:
            RuntimeError: the graph has not been called yet, so nothing is compiled.
        """
        return self._compiled(self._context, "compile_context")

    def _compiled(self, value, what: str):
        """``value`` (what the last compile recorded as ``what``), or the error of a graph that
        has not been called yet."""
        if value is None:
            raise RuntimeError(f"{type(self).__name__}.{what}: nothing is compiled yet; call the "
                               "graph once with example inputs (the first call traces and "
                               "compiles)")
        return value

    @property
    def optimizers(self) -> tuple:
        """The optimizers added with :meth:`add_optimizer`, in order."""
        return tuple(self._optimizers)

    @property
    def lr_schedulers(self) -> tuple:
        """The schedulers given to :meth:`add_optimizer` (``lr_sch``), in order."""
        return tuple(s for _, s in self._lr_schedulers)

    @property
    def grad_scaler(self):
        """The loss scaler set with :meth:`set_grad_scaler`, or None."""
        return self._grad_scaler

    @property
    def plans(self) -> "OrderedDict[tuple, Plan]":
        """The cached plans, least recently used first, keyed by input signature (``(shape,
        dtype)`` per input) followed by the modules' ``training`` flags."""
        return self._plans
