"""Kernel choices made by measurement on this machine, kept on disk: cuDNN's benchmark mode
(``torch.backends.cudnn.benchmark``) and XLA's GEMM autotuner, for the CPU kernels.

The candidates are data: a builder with a choice to make (``matmul.build_matmul``, the
convolutions of ``conv``) calls :func:`choose` with the node's *class* (for a matmul: the shape
bucket, dtypes, transposes and output) and an ordered dict of its candidates, each a builder of
the builder contract (``(node, ins, outs) -> steps``, ``runtime.backend.Backend``, or None where
that candidate does not apply to the node): the first is the built-in rules (hand-set
thresholds, measured on one machine); one named :data:`PREFERRED` (``"blas"``) is the library
call. Adding a candidate is one entry in that dict (``matmul.CANDIDATES``). The tuner answers
with the winner's steps on the node's buffers:

1. the first candidate's steps are built; the class is that key plus the kernels those steps
   call and the thread counts in force (Numba's, BLAS's), so a class holds products the rules
   treat alike, measured at the threads they run at;
2. ``MINIFLOW_MATMUL=numba`` (``blas``, ``mkl``) takes the candidate of that name where it
   applies, else the first, with no measuring; ``auto`` (the default) looks the class up in the machine's file, then measures;
3. measuring builds every candidate on sample arrays of the node's shapes, dtypes and strides
   (a transposed view stays a transposed view; random values: ``np.empty``'s untouched pages
   all read the one zero page and would time as if in cache), runs each once (compiling or
   loading its kernels: not counted), then times them in interleaved rounds (at least
   ``MIN_ROUNDS``, at most ``MAX_ROUNDS``, fewer once ``CLASS_BUDGET_S`` is spent; each timed
   sample repeats a short candidate to about ``SAMPLE_S``) and compares medians: by the CPU
   time of the calling thread when Numba and BLAS run one thread (time the machine gave other
   processes is not counted, so a choice made under load is the one an idle machine makes),
   else by wall time. On cores other processes keep busy the threaded candidates are starved
   (their threads meet at every kernel's end), so a choice timed by wall time while other
   processes used more of this process's cores than its threads leave them (``team``'s look at
   ``/proc/stat`` over the timed rounds, :func:`team.team_size`) is this process's only: not
   written, measured again by a later process (one such file, written on a busy core, made the
   wide MLP's 2-thread step 1.4-1.6x slower on idle cores: ``benchmarks/README.md``, eighteenth
   round). The :data:`PREFERRED` candidate (else the first) wins unless another's
   median beats it by more than ``MARGIN`` (then the fastest such one): so that runs on a noisy
   machine choose alike where it hardly matters, and the library call, whose speed holds on
   every CPU, keeps what it does not clearly lose. Candidates whose steps call the same kernels
   are one (the first of them is timed); if all are one, nothing is measured;
4. each new model (a plan being built: ``Backend.begin_plan``) may spend at most ``BUDGET_S``
   seconds of timed runs measuring; past it, its new classes take, for this process, the
   candidate most cached classes of their kind at their thread counts chose (none cached: the
   rules'; :meth:`Tuner.usual`), and are measured by a later process;
5. a process keeps the choice it took for a class (cached, measured, guessed or broadcast) for
   as long as it runs, whatever another process writes to the file meanwhile: two plans of one
   process that share a class run the same kernels, bit for bit (under ``mpiexec`` a
   data-parallel plan takes rank 0's choice on every rank, as below, even for a class another
   rank took otherwise in a plan of its own).

The file: ``tuning-<digest>.json`` in ``$NUMBA_CACHE_DIR/miniflow_tuning`` (or
``miniflow_tuning`` in Numba's user-wide cache folder when ``NUMBA_CACHE_DIR`` is not set), the
digest a SHA-256 of :func:`machine` (the CPU's model, the CPU name and features Numba compiles for,
and every BLAS library: threadpoolctl's internal API, version and core type): one small file per
machine and configuration, ``{"format": FORMAT, "machine": {...}, "choices": {class: name}}``, at
most ``MAX_CHOICES`` classes (the oldest go first). It is written atomically (a temporary file in
the same folder, then ``os.replace``; readable as Numba's cache files are, the umask's mode),
merged with what another process wrote meanwhile. A file that is no such JSON, was written for
another machine, is bigger than ``MAX_BYTES`` or is no regular file (a FIFO, a device) is
ignored with one notice and replaced; an unwritable folder (or a folder in the file's place)
means the choices are measured in every process and kept in memory, said once, and
``miniflow info`` says so before any run tried to write.

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
import stat
import sys
import tempfile
import time

import llvmlite.binding as llvm
import numba
import numpy as np

from ... import distributed
from ...environment import MATMUL_MODES, read
from . import team
from .common import numpy_blas

__all__ = ["PREFERRED", "ENV", "MODES", "FORMAT", "MAX_CHOICES", "BUDGET_S", "CLASS_BUDGET_S",
           "MIN_ROUNDS", "MAX_ROUNDS", "SAMPLE_S", "MARGIN", "MAX_BYTES", "Tuner",
           "TUNER", "choose", "machine", "mode", "folder", "describe", "numpy_blas", "begin_model"]

PREFERRED = "blas"
"""The candidate that wins unless another beats it by ``MARGIN``: the library call."""
ENV = "MINIFLOW_MATMUL"
"""The override: ``auto`` (measure; the default), ``numba`` (the built-in rules: every choice's
first candidate, or the one named ``numba``), ``blas`` (the one named ``blas``, else the first:
a convolution's GEMMs are BLAS in every candidate), ``packed`` (the packed GEMM,
``matmul.packed_steps``, where it takes the product, else the first) or ``mkl`` (oneMKL's
half-type GEMM where it is offered, ``matmul.mkl_steps``, else the first)."""
MODES = MATMUL_MODES
"""The values of :data:`ENV` (``miniflow.environment`` reads it)."""
FORMAT = "miniflow-tuning-4"
"""The file's ``format`` field; a file with another is ignored (and replaced). 3: matmul's
``packed`` candidate (issue 23): the classes cached before it were never measured against it.
4: one thread pool (``blas_split``): at more than one thread the candidates run otherwise than
those cached were measured."""
MAX_CHOICES = 512
"""Classes a file keeps (a model has a few dozen; about 100 bytes each)."""
MAX_BYTES = 1 << 20
"""A file bigger than this (about 2 KiB a choice) is not read: ignored and replaced."""
BUDGET_S = 2.0
"""Seconds of timed runs one model (plan) spends measuring, at most (then the rules choose)."""
CLASS_BUDGET_S = 0.25
"""Seconds of timed runs after which a class's measurement stops at ``MIN_ROUNDS`` rounds."""
MIN_ROUNDS, MAX_ROUNDS = 5, 11
"""Interleaved rounds (one timed sample of every candidate each) per class."""
SAMPLE_S = 1e-3
"""Seconds a timed sample lasts at least: a candidate faster than that is run several times per
sample (as many as the slowest candidate's warm-up run fits), so that a few-microsecond product
is not timed by one call's jitter."""
MARGIN = 0.05
"""Relative margin by which a candidate's median must beat the preferred one's to win."""


def mode() -> str:
    """``MINIFLOW_MATMUL`` (any case, spaces stripped; unset or blank: ``"auto"``).

    Raises:
        miniflow.environment.EnvironmentValueError: another value (a ValueError), naming the
            variable, its value and the valid ones.
    """
    return read(ENV, "auto")


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


def _umask() -> int:
    """The process's umask: Linux's ``/proc/self/status`` says it; elsewhere it is set and
    restored (there is no call that only reads it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _differences(theirs, ours: dict) -> str:
    """What differs between a tuning file's ``machine`` and this one's (:func:`machine`): each
    differing key with the file's value and this machine's, values cut to 60 characters."""
    def cut(value) -> str:
        text = str(value)
        return repr(text if len(text) <= 60 else text[:57] + "...")

    if not isinstance(theirs, dict):
        return f"its machine is {cut(theirs)}"
    return "; ".join(f"{k}: file {cut(theirs.get(k))}, here {cut(ours.get(k))}"
                     for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k))


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
    """Seconds ``run()`` takes (``time.perf_counter``): :class:`Tuner`'s timer where Numba or
    BLAS runs more than one thread."""
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _cpu_time(name: str, run) -> float:
    """CPU seconds of the calling thread during ``run()`` (``time.thread_time``): :class:`Tuner`'s
    timer where Numba and BLAS run one thread (every kernel runs on the calling thread)."""
    t0 = time.thread_time()
    run()
    return time.thread_time() - t0


class _Watch:
    """:class:`Tuner`'s default watch: ``watch(run)`` runs ``run()`` (a class's timed rounds) and
    answers the cores' worth of time other processes used on this process's cores over at least
    the last ``WINDOW_S`` seconds (:func:`team.others_between` of two ``/proc/stat`` looks; None
    where it does not say). A class's rounds may last a few milliseconds, and ``/proc/stat``
    counts in ticks of 10 ms: the window reaches back to an earlier look (made at this watch's
    start or at an earlier class's end) where the rounds alone are shorter."""

    WINDOW_S = 0.1

    def __init__(self):
        self.cores = team.cores()
        self._looks = [team.snapshot(self.cores)]

    def __call__(self, run) -> float | None:
        run()
        now = team.snapshot(self.cores)
        if now is None or self._looks[0] is None:
            return None
        older = [look for look in self._looks if look[2] <= now[2] - self.WINDOW_S]
        start = older[-1] if older else self._looks[0]
        self._looks = [start] + [look for look in self._looks if look[2] > start[2]] + [now]
        return team.others_between(start, now)


def _unwatched(run) -> None:
    """Run ``run()`` and say nothing of other processes: the watch where a test's timer times."""
    run()


def _threads() -> tuple:
    """``(Numba's threads, the most threads of NumPy's BLAS)`` in force."""
    return numba.get_num_threads(), max((lib.num_threads for lib in numpy_blas()), default=1)


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
    """Arrays of ``arrays``' shapes, dtypes and strides (views into a fresh buffer as big as the
    span the original's strides reach: a transposed view or a block of a bigger matrix is read
    as the plan reads it): floats drawn uniformly from [-1, 1), others 0."""
    out = []
    for a in arrays:
        if a.size == 0 or any(s < 0 for s in a.strides):
            out.append(np.zeros(a.shape, a.dtype))
            continue
        span = sum((n - 1) * s for n, s in zip(a.shape, a.strides)) // a.itemsize + 1
        if a.dtype.kind == "f" or a.dtype.itemsize == 2 and a.dtype.kind == "V":
            flat = (2 * rng.random(span, dtype=np.float32) - 1).astype(a.dtype)
        else:
            flat = np.zeros(span, a.dtype)
        out.append(np.lib.stride_tricks.as_strided(flat, a.shape, a.strides))
    return out


class Tuner:
    """The choices of one process: those read from the machine's file, measured or broadcast.

    Args:
        path: the tuning file (default: :func:`folder`'s file for :func:`machine`), read on first
            use.
        timer: ``timer(name, run) -> seconds``: calls ``run()`` (one timed sample of candidate
            ``name``'s steps) and says how long it took (default: the calling thread's CPU time
            at one thread, else wall time; tests pass a fake one).
        watch: ``watch(run) -> others``: calls ``run()`` (a class's timed rounds) and says how
            many cores' worth of time other processes used on this process's cores meanwhile
            (None: unknown); a threaded class measured while they left fewer free cores than
            its threads is not written (default: a :class:`_Watch` with the default timer,
            else none).
    """

    def __init__(self, path: str | None = None, timer=None, watch=None):
        self.machine = machine()
        if path is None:
            digest = hashlib.sha256(json.dumps(self.machine, sort_keys=True).encode())
            path = os.path.join(folder(), f"tuning-{digest.hexdigest()[:16]}.json")
        self.path = path
        self.timer = timer
        self.watch = watch or (_Watch() if timer is None else _unwatched)
        self.choices: dict | None = None
        self.in_memory = False
        """True once the file could not be written: choices live in this process only."""
        self.spent = 0.0
        """Seconds of timed runs spent measuring for the current model (about ``BUDGET_S`` at
        most; :func:`begin_model` resets it)."""
        self.measured = 0
        """Classes this process measured."""
        self.unsteady = 0
        """Classes it measured while other processes held the cores (kept, not written)."""
        self.taken: dict = {}
        """The choice this process took for each class it met: it keeps it while it runs."""
        self.collective = False
        """Whether the plan being built is built by every rank in step (:func:`begin_model`)."""

    # ------------------------------------------------------------------ the file
    def _read(self, notify: bool) -> dict:
        """The choices in the file ({} when it is missing; when it is corrupt or foreign, or not
        a regular file of at most ``MAX_BYTES``, {} and, with ``notify``, one notice; a folder
        in its place cannot be replaced: the choices are kept in memory, said once)."""
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):   # no file (or its folder is a file)
            return {}
        except OSError as e:
            return self._ignored(notify, f"it cannot be read ({type(e).__name__}: {e})")
        if stat.S_ISDIR(st.st_mode):
            self._in_memory("it is a folder")
            return {}
        if not stat.S_ISREG(st.st_mode):     # a FIFO would block, /dev/zero never end
            return self._ignored(notify, "it is not a regular file")
        if st.st_size > MAX_BYTES:
            return self._ignored(notify, f"it holds {st.st_size} bytes, more than the "
                                         f"{MAX_BYTES} of {MAX_CHOICES} choices")
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError, RecursionError) as e:     # RecursionError: deep nesting
            return self._ignored(notify, f"it cannot be read as JSON ({type(e).__name__}: "
                                         f"{str(e)[:200]})")
        if (not isinstance(data, dict) or data.get("format") != FORMAT
                or not isinstance(data.get("choices"), dict)
                or not all(isinstance(k, str) and isinstance(v, str)
                           for k, v in data["choices"].items())):
            return self._ignored(notify, f"it is not a {FORMAT} file")
        if data.get("machine") != self.machine:
            return self._ignored(notify, "it was written for another machine or configuration "
                                         f"({_differences(data.get('machine'), self.machine)})")
        return dict(data["choices"])

    def _ignored(self, notify: bool, why: str) -> dict:
        if notify:
            _notice("ignored", f"miniflow: ignoring the kernel choices in {self.path}: {why}; "
                               f"a run measures them again and replaces the file")
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
            os.fchmod(fd, 0o666 & ~_umask())    # as open() would make it (mkstemp: 0600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            where = os.path.dirname(self.path)
            self._in_memory(f"{where} is a file, not a folder" if os.path.exists(where)
                            and not os.path.isdir(where) else e.strerror or e)
            return
        self.choices = merged

    def _in_memory(self, why) -> None:
        """The file cannot be written (``why``): keep the choices in memory, said once."""
        self.in_memory = True
        _notice("read-only", f"miniflow: cannot write the kernel choices to {self.path} ({why}); "
                             f"they are measured in every run and kept in memory (set "
                             f"NUMBA_CACHE_DIR to a writable folder to keep them)")

    # ------------------------------------------------------------------ choosing
    def decide(self, key: str, node, ins, outs, candidates: dict, first) -> str:
        """The name of the candidate for class ``key`` (see the module docstring): the one this
        process took before, else cached, else measured now (and written to the file), else
        past the budget :meth:`usual`."""
        names = list(candidates)
        known = self.taken.get(key, self.load().get(key))
        if known not in names:
            known = self._new(key, node, ins, outs, candidates, first)
        self.taken[key] = known
        return known

    def _new(self, key: str, node, ins, outs, candidates: dict, first) -> str:
        """:meth:`decide` for a class that is neither taken nor cached."""
        if self.spent >= BUDGET_S:
            return self.usual(key, list(candidates))
        winner, measured, steady = self.measure(node, ins, outs, candidates, first)
        if measured and steady:
            self.choices[key] = winner
            self._save()
        self.unsteady += measured and not steady
        return winner

    def usual(self, key: str, names: list) -> str:
        """The candidate of ``names`` that most cached classes of ``key``'s kind at its thread
        counts chose (ties and none: the first, the rules): the guess for a class the budget
        leaves unmeasured (a threaded BLAS that loses on this machine loses on most classes)."""
        kind, threads = key.split(" ", 1)[0] + " ", " | " + key.rsplit(" | ", 1)[-1]
        votes = [name for k, name in self.load().items()
                 if k.startswith(kind) and k.endswith(threads) and name in names]
        return max(names, key=lambda name: (votes.count(name), -names.index(name)))

    def measure(self, node, ins, outs, candidates: dict, first) -> tuple:
        """``(winner, measured, steady)``: every candidate built on sample arrays and timed
        (module docstring); ``measured`` is False when their steps call the same kernels (the
        first wins; nothing is timed); ``steady`` is False when the candidates ran on more than
        one thread while other processes left fewer free cores than that (:attr:`watch`), the
        threads counted up to the cores this process may run on (``NUMBA_NUM_THREADS=2`` under
        ``taskset -c 1``: one; counting two, every such class was unsteady and measured again in
        every run, its choice and so the bits differing from run to run).
        ``first``: the first candidate's steps on the real buffers."""
        rng = np.random.default_rng(0)
        sample_ins = _samples(ins, rng)
        built, seen = {}, {}
        for name, build in candidates.items():
            steps = build(node, sample_ins, _samples(outs, rng))
            if steps is not None and seen.setdefault(_kernels(steps), name) == name:
                built[name] = steps      # candidates calling the same kernels: the first only
        names = list(built)
        if len(names) == 1 and _kernels(first) == _kernels(built[names[0]]):
            return names[0], False, True
        threads = _threads()
        threaded = threads != (1, 1)
        timer = self.timer or (_wall_time if threaded else _cpu_time)
        for name in names:      # warm up (not counted): compile or load kernels, touch pages
            _run(built[name])
        slowest = 0.0
        for name in names:      # one warm call each: how many calls make a sample
            t0 = time.perf_counter()
            _run(built[name])
            slowest = max(slowest, time.perf_counter() - t0)
        reps = int(min(100, max(1, SAMPLE_S // max(slowest, 1e-7))))
        times = {name: [] for name in names}

        def rounds():
            for r in range(MAX_ROUNDS):
                if r >= MIN_ROUNDS and sum(map(sum, times.values())) >= CLASS_BUDGET_S:
                    break
                for name in names if r % 2 == 0 else names[::-1]:
                    times[name].append(timer(name, lambda s=built[name]: [_run(s)
                                                                         for _ in range(reps)]))

        others = self.watch(rounds) if threaded else rounds()
        self.spent += sum(map(sum, times.values()))
        self.measured += 1
        median = {name: float(np.median(t)) for name, t in times.items()}
        preferred = PREFERRED if PREFERRED in median else names[0]
        faster = [n for n in names if median[n] * (1 + MARGIN) < median[preferred]]
        usable = min(max(threads), len(team.cores()))    # the most a run can have here
        steady = others is None or team.free_cores(len(team.cores()), others) >= usable
        return (min(faster, key=median.get) if faster else preferred), True, steady

    def choose(self, kind: str, key: str, node, ins, outs, candidates: dict) -> list:
        """The steps of the chosen candidate on the node's buffers (module docstring)."""
        how = mode()
        first = next(iter(candidates))
        if how != "auto":
            steps = candidates[how](node, ins, outs) if how in candidates else None
            return steps if steps is not None else candidates[first](node, ins, outs)
        steps = candidates[first](node, ins, outs)
        numba_threads, blas_threads = _threads()
        key = f"{kind} {key} | {_kernels(steps)} | threads {numba_threads}/{blas_threads}"
        if self.collective and distributed.is_initialized() and distributed.world_size() > 1:
            name = (self._decide_alone(key, node, ins, outs, candidates, steps)
                    if distributed.rank() == 0 else None)
            name = distributed.broadcast_object(name, f"the kernel choice for {key}")
            self.taken[key] = name
        else:
            name = self.decide(key, node, ins, outs, candidates, steps)
        chosen = None if name == first else candidates[name](node, ins, outs)
        return steps if chosen is None else chosen

    def _decide_alone(self, key: str, node, ins, outs, candidates: dict, first) -> str:
        """:meth:`decide` on rank 0 of a collective plan, the other ranks waiting for its
        broadcast. The candidates it builds to measure them may choose classes of their own (a
        Winograd convolution's products) that no other rank builds now: those choices are this
        rank's alone, not collectives (a nested broadcast reached the ranks waiting for this
        one: ``KeyError: 'blas'`` in a conv choice on rank 1, or a hang). The winner's steps,
        built by every rank after the broadcast, broadcast their nested choices again."""
        self.collective = False
        try:
            return self.decide(key, node, ins, outs, candidates, first)
        finally:
            self.collective = True

    def _writable(self) -> bool:
        """Whether the file can be written: no folder in its place, and its folder (or the
        first of its parents that exists, where it would be made) a writable folder."""
        if os.path.isdir(self.path):
            return False
        where = os.path.dirname(self.path)
        while not os.path.lexists(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
        return os.path.isdir(where) and os.access(where, os.W_OK | os.X_OK)

    def describe(self) -> list:
        """Lines for ``miniflow info``: the file and every cached choice."""
        choices = self.load()
        where = (f"kept in memory only ({self.path} cannot be written)"
                 if self.in_memory or not self._writable() else f"cached in {self.path}")
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
    """The steps of the chosen candidate for ``node`` on its buffers ``ins`` / ``outs``:
    ``candidates`` maps names to builders (``(node, ins, outs) -> steps``, or None where the
    candidate does not apply), the built-in rules first, the first never None; ``kind`` (the
    op family, ``"matmul"``) and ``key`` describe the node's class (module docstring).

    Raises:
        ValueError: ``MINIFLOW_MATMUL`` is not one of :data:`MODES`.
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
