"""Kernel choices made by measurement on this machine, kept on disk: cuDNN's benchmark mode
(``torch.backends.cudnn.benchmark``) and XLA's GEMM autotuner, for the CPU kernels.

The choices are data: :data:`CHOICES` names, per kind of choice, its candidates, each a builder of
the builder contract (``(node, ins, outs) -> steps``, ``runtime.backend.Backend``). The first is
the one the built-in rules build (hand-set thresholds, measured on one machine), the last the
library call (NumPy's BLAS). A builder with a choice to make calls :func:`choose` with the node's
*class* (for a matmul: the shape bucket, dtypes, transposes and output; ``matmul.build_matmul``)
and its candidates; the tuner answers with the winner's steps on the node's buffers:

1. the first candidate's steps are built; the class is that key plus the kernels those steps
   call and the thread counts in force (Numba's, BLAS's), so a class holds products the rules
   treat alike, measured at the threads they run at;
2. ``MINIFLOW_MATMUL=numba`` (``blas``) takes the first (last) candidate of every choice, with no
   measuring (``mkl``: that candidate where offered, else the first); ``auto`` (the default)
   looks the class up in the machine's file, then measures;
3. measuring builds every candidate on sample arrays of the node's shapes and dtypes (random
   values: ``np.empty``'s untouched pages all read the one zero page and would time as if in
   cache), runs each once (compiling or loading its kernels: not counted), then times them in
   interleaved rounds (at least ``MIN_ROUNDS``, at most ``MAX_ROUNDS``, fewer once
   ``CLASS_BUDGET_S`` is spent) and takes the lowest median; a candidate wins over an earlier one
   only by more than ``TIE`` (so that two runs on a noisy machine choose alike where it hardly
   matters). Candidates whose steps call the same kernels are one: nothing is measured;
4. each new model (a plan being built: ``Backend.begin_plan``) may spend at most ``BUDGET_S``
   seconds of timed runs measuring; past it, its new classes take the rules' candidate for this
   process and are measured by a later one.

The file: ``tuning-<digest>.json`` in ``$NUMBA_CACHE_DIR/miniflow_tuning`` (or
``miniflow_tuning`` in Numba's user-wide cache folder when ``NUMBA_CACHE_DIR`` is not set), the
digest a SHA-256 of :func:`machine` (the CPU's model, the CPU name and features Numba compiles for,
and every BLAS library: threadpoolctl's internal API, version and core type): one small file per
machine and configuration, ``{"format": FORMAT, "machine": {...}, "choices": {class: name}}``, at
most ``MAX_CHOICES`` classes (the oldest go first). It is written atomically (a temporary file in
the same folder, then ``os.replace``), merged with what another process wrote meanwhile. A file
that is no such JSON, or was written for another machine, is ignored with one notice and
replaced; an unwritable folder means the choices are measured in every process and kept in
memory, said once.

Under ``mpiexec`` one rank measures and all use its choice: for a plan every rank builds in step
(a data-parallel graph: ``Backend.begin_plan(collective=True)``) rank 0 decides every class (from
its file or by measuring) and broadcasts the name (``distributed.broadcast_object``), so ranks on
machines of different speeds build the same plans; the others measure nothing and write nothing.
A plan one rank builds alone (rank 0's evaluation graph) is decided by that rank, with no
collective (it would wait for ranks that never come).

Once a class is in the file, the choice, and so every bit of the result, is the same in every run.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import time

import llvmlite.binding as llvm
import numba
import numpy as np

from ... import distributed
from .common import blas_libraries

__all__ = ["CHOICES", "ENV", "MODES", "FORMAT", "MAX_CHOICES", "BUDGET_S", "CLASS_BUDGET_S",
           "MIN_ROUNDS", "MAX_ROUNDS", "TIE", "Tuner", "TUNER", "choose", "machine", "mode",
           "folder", "describe", "numpy_blas", "begin_model"]

CHOICES = {"matmul": ("numba", "mkl", "blas")}
"""Kind of choice -> its candidates' names: the built-in rules' first, the library call last;
those between are offered only where they run (``mkl``: half types on AMX, ``mkl_gemm``)."""
ENV = "MINIFLOW_MATMUL"
"""The override: ``auto`` (measure; the default), ``numba`` (every choice's first candidate, the
built-in rules), ``blas`` (the last, the library call) or ``mkl`` (that candidate where it is
offered, else the first)."""
MODES = ("auto", "numba", "blas", "mkl")
FORMAT = "miniflow-tuning-1"
"""The file's ``format`` field; a file with another is ignored (and replaced)."""
MAX_CHOICES = 512
"""Classes a file keeps (a model has a few dozen; about 100 bytes each)."""
BUDGET_S = 2.0
"""Seconds of timed runs one model (plan) spends measuring, at most (then the rules choose)."""
CLASS_BUDGET_S = 0.25
"""Seconds of timed runs after which a class's measurement stops at ``MIN_ROUNDS`` rounds."""
MIN_ROUNDS, MAX_ROUNDS = 3, 9
"""Interleaved rounds (one timed run of every candidate each) per class."""
TIE = 0.02
"""Relative margin a later candidate's median must beat an earlier one's by to win."""


def mode() -> str:
    """``MINIFLOW_MATMUL`` (lower-cased, spaces stripped; unset or empty: ``"auto"``).

    Raises:
        ValueError: another value, naming the variable, its value and the valid ones.
    """
    raw = os.environ.get(ENV, "")
    value = raw.strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"miniflow: {ENV}={raw!r} is not one of {', '.join(MODES)}: auto "
                         f"measures which kernel is faster on this machine (the default), numba "
                         f"uses the Numba kernels where the built-in rules do, blas calls BLAS, "
                         f"mkl calls oneMKL for the half-type products (the amx extra)")
    return value


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``, else ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numpy_blas() -> list:
    """threadpoolctl's controllers of the BLAS that ``np.dot`` calls: those loaded from NumPy's
    own folders (a wheel's ``numpy.libs``), else every BLAS loaded (a NumPy linked to the
    system's). Another package's BLAS (SciPy's, loaded by scikit-learn) is not NumPy's."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    libs = blas_libraries()
    own = [lib for lib in libs if os.path.abspath(lib.filepath).startswith(
        (os.path.join(site, "numpy") + os.sep, os.path.join(site, "numpy.libs") + os.sep))]
    return own or libs


def machine() -> dict:
    """What the choices depend on besides the class: ``cpu`` (the model name), ``target`` and
    ``features`` (the CPU name and the enabled features Numba compiles for: ``NUMBA_CPU_NAME`` /
    ``NUMBA_CPU_FEATURES`` or the host's, Numba's own rule), ``blas`` (per library of
    :func:`numpy_blas`: ``"<internal api> <version> <core type>"``, threadpoolctl)."""
    features = numba.config.CPU_FEATURES
    if features is None:
        features = llvm.get_host_cpu_features().flatten()
    blas = [f"{lib.internal_api} {lib.version} {getattr(lib, 'architecture', None) or '?'}"
            for lib in numpy_blas()]
    return {"cpu": _cpu_model(), "target": numba.config.CPU_NAME or llvm.get_host_cpu_name(),
            "features": ",".join(sorted(f[1:] for f in features.split(",") if f.startswith("+"))),
            "blas": blas}


def folder() -> str:
    """The folder of the tuning files, beside Numba's cache (see the module docstring)."""
    from numba.misc.appdirs import AppDirs
    root = numba.config.CACHE_DIR or AppDirs(appname="numba", appauthor=False).user_cache_dir
    return os.path.join(os.path.abspath(root), "miniflow_tuning")


_SHOWN: set = set()


def _notice(kind: str, text: str) -> None:
    """Print ``text`` to stderr, once per process and ``kind`` (above a progress bar, as the
    compile notice)."""
    if kind in _SHOWN:
        return
    _SHOWN.add(kind)
    from tqdm import tqdm
    with tqdm.external_write_mode(file=sys.stderr):
        print(text, file=sys.stderr, flush=True)


def _wall_time(name: str, run) -> float:
    """Seconds ``run()`` takes (``time.perf_counter``); the default timer of :class:`Tuner`."""
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _run(steps) -> None:
    """Run ``steps`` once (floating-point warnings off, as the plan runs them)."""
    with np.errstate(all="ignore"):
        for fn, args in steps:
            fn(*args)


def _name(fn) -> str:
    """A step function's name: a kernel's factory (``outer_block_kernel``), `` parallel`` for its
    parallel variant; another function's ``__name__``."""
    py_func = getattr(fn, "py_func", None)
    if py_func is None:
        return getattr(fn, "__name__", type(fn).__name__)
    parallel = " parallel" if getattr(fn, "targetoptions", {}).get("parallel") else ""
    return py_func.__qualname__.split(".")[0] + parallel


def _kernels(steps) -> str:
    """The names of the functions ``steps`` call (:func:`_name`), ``" + "``-joined."""
    return " + ".join(_name(fn) for fn, _ in steps)


def _samples(arrays, rng) -> list:
    """Arrays of ``arrays``' shapes and dtypes: floats drawn uniformly from [-1, 1), others 0."""
    out = []
    for a in arrays:
        if a.dtype.kind == "f" or a.dtype.itemsize == 2 and a.dtype.kind == "V":
            x = rng.random(a.shape, dtype=np.float32)
            out.append((2 * x - 1).astype(a.dtype))
        else:
            out.append(np.zeros(a.shape, a.dtype))
    return out


class Tuner:
    """The choices of one process: those read from the machine's file, measured or broadcast.

    Args:
        path: the tuning file (default: :func:`folder`'s file for :func:`machine`), read on first
            use.
        timer: ``timer(name, run) -> seconds``: calls ``run()`` (one run of candidate ``name``'s
            steps) and says how long it took (default: wall time; tests pass a fake one).
    """

    def __init__(self, path: str | None = None, timer=None):
        self.machine = machine()
        if path is None:
            digest = hashlib.sha256(json.dumps(self.machine, sort_keys=True).encode())
            path = os.path.join(folder(), f"tuning-{digest.hexdigest()[:16]}.json")
        self.path = path
        self.timer = timer or _wall_time
        self.choices: dict | None = None
        self.in_memory = False
        """True once the file could not be written: choices live in this process only."""
        self.spent = 0.0
        """Seconds of timed runs spent measuring for the current model (about ``BUDGET_S`` at
        most; :func:`begin_model` resets it)."""
        self.measured = 0
        """Classes this process measured."""
        self.collective = False
        """Whether the plan being built is built by every rank in step (:func:`begin_model`)."""

    # ------------------------------------------------------------------ the file
    def _read(self, notify: bool) -> dict:
        """The choices in the file ({} when it is missing; when it is corrupt or foreign, {} and,
        with ``notify``, one notice)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            return self._ignored(notify, f"it cannot be read as JSON ({type(e).__name__}: {e})")
        if (not isinstance(data, dict) or data.get("format") != FORMAT
                or not isinstance(data.get("choices"), dict)
                or not all(isinstance(k, str) and isinstance(v, str)
                           for k, v in data["choices"].items())):
            return self._ignored(notify, f"it is not a {FORMAT} file")
        if data.get("machine") != self.machine:
            return self._ignored(notify, "it was written for another machine or configuration "
                                         f"({data.get('machine')!r})")
        return dict(data["choices"])

    def _ignored(self, notify: bool, why: str) -> dict:
        if notify:
            _notice("ignored", f"miniflow: ignoring the kernel choices in {self.path}: {why}; "
                               f"measuring them again and replacing the file")
        return {}

    def load(self) -> dict:
        """The choices (read from the file at the first call)."""
        if self.choices is None:
            self.choices = self._read(notify=True)
        return self.choices

    def _save(self) -> None:
        """Write the choices, merged with the file's current ones, atomically; at most
        ``MAX_CHOICES`` (this process's newest kept). On an unwritable folder, say so once and
        keep them in memory."""
        if self.in_memory:
            return
        merged = {k: v for k, v in self._read(notify=False).items() if k not in self.choices}
        merged.update(self.choices)             # in order of arrival: the newest last
        merged = dict(list(merged.items())[-MAX_CHOICES:])
        text = json.dumps({"format": FORMAT, "machine": self.machine, "choices": merged},
                          indent=1)
        tmp = None
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".tuning-",
                                       suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            self.in_memory = True
            _notice("read-only", f"miniflow: cannot write the kernel choices to {self.path} "
                                 f"({e.strerror or e}); they are measured in every run and kept "
                                 f"in memory (set NUMBA_CACHE_DIR to a writable folder to keep "
                                 f"them)")
            return
        self.choices = merged

    # ------------------------------------------------------------------ choosing
    def decide(self, kind: str, key: str, node, ins, outs, candidates: dict, first) -> str:
        """The name of ``kind``'s candidate for class ``key`` (see the module docstring):
        cached, or measured now (and written to the file), or the first one past the budget."""
        names = list(candidates)
        known = self.load().get(key)
        if known in names:
            return known
        if self.spent >= BUDGET_S:
            return names[0]
        winner, measured = self.measure(node, ins, outs, candidates, first)
        if measured:
            self.choices[key] = winner
            self._save()
        return winner

    def measure(self, node, ins, outs, candidates: dict, first) -> tuple:
        """``(winner, measured)``: every candidate built on sample arrays and timed (module
        docstring); ``measured`` is False when their steps call the same kernels (the first
        wins; nothing is timed). ``first``: the first candidate's steps on the real buffers."""
        names = list(candidates)
        rng = np.random.default_rng(0)
        sample_ins = _samples(ins, rng)
        built = {}
        for name in names:
            sample_outs = [np.empty(o.shape, o.dtype) for o in outs]
            built[name] = candidates[name](node, sample_ins, sample_outs)
        if len({_kernels(s) for s in built.values()}) == 1 and _kernels(first) == _kernels(
                built[names[0]]):
            return names[0], False
        for name in names:      # warm up (not counted): compile or load kernels, touch pages
            _run(built[name])
        times = {name: [] for name in names}
        class_spent = 0.0
        for r in range(MAX_ROUNDS):
            if r >= MIN_ROUNDS and class_spent >= CLASS_BUDGET_S:
                break
            for name in names if r % 2 == 0 else names[::-1]:
                t = self.timer(name, lambda s=built[name]: _run(s))
                times[name].append(t)
                class_spent += t
        self.spent += class_spent
        self.measured += 1
        winner = names[0]
        for name in names[1:]:
            if np.median(times[name]) * (1 + TIE) < np.median(times[winner]):
                winner = name
        return winner, True

    def choose(self, kind: str, key: str, node, ins, outs, candidates: dict) -> list:
        """The steps of the chosen candidate on the node's buffers (module docstring)."""
        names = CHOICES[kind]
        if (tuple(candidates) != tuple(n for n in names if n in candidates)
                or names[0] not in candidates or names[-1] not in candidates):
            raise ValueError(f"tune.choose: {kind!r} has the candidates {names} (the first and "
                             f"last always), got {tuple(candidates)}")
        how = mode()
        if how != "auto":
            how = {"numba": names[0], "blas": names[-1]}.get(how, how)
            return candidates[how if how in candidates else names[0]](node, ins, outs)
        first = candidates[names[0]](node, ins, outs)
        key = (f"{kind} {key} | {_kernels(first)} | threads {numba.get_num_threads()}/"
               f"{max((lib.num_threads for lib in numpy_blas()), default=1)}")
        if self.collective and distributed.is_initialized() and distributed.world_size() > 1:
            name = (self.decide(kind, key, node, ins, outs, candidates, first)
                    if distributed.rank() == 0 else None)
            name = distributed.broadcast_object(name, f"the kernel choice for {key}")
            self.load()[key] = name
        else:
            name = self.decide(kind, key, node, ins, outs, candidates, first)
        return first if name == names[0] else candidates[name](node, ins, outs)

    def describe(self) -> list:
        """Lines for ``miniflow info``: the file and every cached choice."""
        choices = self.load()
        where = (f"kept in memory only ({self.path} cannot be written)" if self.in_memory
                 else f"cached in {self.path}")
        lines = [f"kernel choices ({ENV}={mode()}): {len(choices)} {where}"]
        lines += [f"  {key} -> {name}" for key, name in choices.items()]
        return lines


TUNER: Tuner | None = None
"""This process's tuner (made at the first choice; tests put their own here)."""


def _tuner() -> Tuner:
    global TUNER
    if TUNER is None:
        TUNER = Tuner()
    return TUNER


def choose(kind: str, key: str, node, ins, outs, candidates: dict) -> list:
    """The steps of ``kind``'s chosen candidate for ``node`` on its buffers ``ins`` / ``outs``:
    ``candidates`` maps each of ``CHOICES[kind]``, in order, to its builder; ``key`` describes
    the node's class (module docstring).

    Raises:
        ValueError: ``MINIFLOW_MATMUL`` is not one of :data:`MODES`; ``candidates`` are not
            ``CHOICES[kind]``.
    """
    return _tuner().choose(kind, key, node, ins, outs, candidates)


def begin_model(collective: bool = False) -> None:
    """A new model's plan is being built: its new classes get ``BUDGET_S`` of measuring;
    ``collective``: every rank builds it in step, rank 0 decides for all."""
    t = _tuner()
    t.spent, t.collective = 0.0, collective


def describe() -> list:
    """Lines for ``miniflow info``: the tuning file and its cached choices."""
    return _tuner().describe()
