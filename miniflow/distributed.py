"""Data-parallel communication on MPI: the process world and the collectives a plan runs as steps.

miniflow runs on an existing distributed engine, MPI, through ``mpi4py`` with the MPICH that pip
installs (the ``dist`` extra: ``pip install "miniflow[dist]"``, which provides ``mpiexec``)::

    mpiexec -n 2 python train.py

**The world.** :func:`init` reads the MPI world when an MPI launcher started the process (it sets
``PMI_RANK``/``PMI_SIZE``: MPICH's hydra, Intel MPI, srun with PMI; ``OMPI_COMM_WORLD_*``: Open
MPI; ``PMIX_RANK``: PMIx launchers). Otherwise the world is this one process, rank 0 of 1, and MPI
is never imported: the collectives below are then the identity (the mean over one rank is the
array itself). A launcher without mpi4py, or an ``mpiexec`` of another MPI than mpi4py's, is an
error: every process would otherwise train alone as "rank 0 of 1", silently.

**Steps.** The collectives are built once for fixed, preallocated host (NumPy) arrays and return a
plan step ``(fn, args)``, the runtime's step contract: ``fn(*args)`` allocates no array. Building a
step is local (no communication); every rank must build the same steps in the same order, which
the compile driver checks with :func:`check_same_across_ranks` before the first step runs.

- :func:`allreduce_mean_step`: one gradient bucket, averaged across ranks (in place or into
  outputs) in its own dtype (float16 summed in float32, see the function);
  :func:`compute_bucket_assignment_by_size` splits a model's gradients into buckets of about
  25 MB, like PyTorch DDP's ``bucket_cap_mb=25``.
- :func:`allreduce_sum_int64_step`: the non-finite gradient count, summed, so that every rank
  skips a step together.
- :func:`broadcast_step`: parameters and optimizer state from rank 0 at the first compile.

**Failure behaviour: an error ends every rank, never a hang.** In a world of more than one rank,
:func:`init` installs

- a ``sys.excepthook``: an uncaught exception prints its traceback, every line prefixed with
  ``[rank r]``, and calls ``MPI.COMM_WORLD.Abort(1)``; the launcher then kills every rank.
  (Without it, the failing rank's interpreter would wait in ``MPI_Finalize`` and the others in
  their next collective, forever.)
- a watchdog thread: a collective that has waited longer than the timeout (``init(timeout=)``,
  else ``MINIFLOW_DIST_TIMEOUT``, else 600 s, PyTorch NCCL's default) prints which rank waited in
  which collective and aborts the job; this ends the hangs no exception announces (a rank that
  returned or called ``sys.exit`` early, ranks that run different plans). It also ends the rank
  when its parent process (the launcher's proxy) has died, which no launcher reports.

A rank killed by a signal needs neither: MPICH's hydra kills the other ranks within about a second
and ``mpiexec`` exits with the signal's number.
"""
from __future__ import annotations

import hashlib
import math
import os
import sys
import threading
import time
import traceback

import numpy as np

from .environment import read

__all__ = ["RankMismatchError", "abort", "all_gather_object", "allreduce_mean_step",
           "allreduce_sum_int64_step", "announced_world_size",
           "barrier", "broadcast_object", "broadcast_step", "check_same_across_ranks",
           "check_same_values",
           "compute_bucket_assignment_by_size", "destroy_process_group", "get_rank",
           "get_world_size", "init", "init_process_group", "is_initialized", "local_world_size",
           "rank", "same_values", "world_size", "TORCH_BACKENDS"]

DEFAULT_TIMEOUT_S = 600.0
"""How long a collective may wait for the other ranks before the job is aborted (PyTorch's NCCL
process-group default, 10 minutes). ``MINIFLOW_DIST_TIMEOUT`` (seconds) overrides it."""

DEFAULT_BUCKET_CAP_MB = 25.0
"""PyTorch DDP's ``bucket_cap_mb`` default: a bucket closes once it holds this many MiB."""

ABORT_GRACE_S = 0.5
"""Seconds an aborting rank waits, after flushing stderr, for the launcher to forward its message."""

_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "PMIX_RANK")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_MEAN_DTYPES = ("float16", "bfloat16", "float32", "float64")
_HALF = _MEAN_DTYPES[:2]
"""The half types: summed in float32 (MPI has no 16-bit float sum)."""


class RankMismatchError(RuntimeError):
    """The ranks disagree on something they must share (e.g. their graphs' parameter shapes)."""


class _Watchdog:
    """Aborts the job when a collective waits longer than ``timeout`` seconds, or when the
    process's parent (the launcher's proxy) has died. ``pending`` is ``None`` or
    ``(description, monotonic start)``; the steps set it around every blocking MPI call."""

    def __init__(self, world, timeout: float):
        self.world = world
        self.timeout = timeout
        self.pending = None
        self.parent = os.getppid()
        threading.Thread(target=self._run, name="miniflow-dist-watchdog", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 10))
            if os.getppid() != self.parent:
                _report(self.world, f"its parent process {self.parent} (the MPI launcher) has "
                                    f"exited; ending this rank")
                os._exit(1)     # no launcher is left to abort through
            pending = self.pending
            if pending is not None and time.monotonic() - pending[1] > self.timeout:
                _report(self.world, f"{pending[0]} has waited more than {self.timeout:g} s for "
                        f"the other ranks: a rank has exited or hangs, or the ranks run different "
                        f"plans (for longer waits pass init(timeout=...) or set "
                        f"MINIFLOW_DIST_TIMEOUT); aborting all {self.world.size} ranks")
                self.world.abort(1)


class _World:
    """The process world: ``rank``, ``size``, ``local_size`` (ranks on this machine), and for MPI
    worlds ``comm`` (a duplicate of ``COMM_WORLD``, so miniflow's messages never mix with the
    user's: the steps' collectives), ``control`` (another duplicate, for :func:`barrier` and
    :func:`check_same_across_ranks`: a rank that compiles while the others run steps waits
    there, and the watchdog reports it, instead of matching its messages with their steps'),
    ``mpi`` (the module) and ``watch`` (the watchdog; None in a one-rank world)."""

    def __init__(self, mpi=None, timeout: float = DEFAULT_TIMEOUT_S):
        self.mpi = mpi
        self.comm = mpi.COMM_WORLD.Dup() if mpi is not None else None
        self.control = self.comm.Dup() if mpi is not None else None
        self.rank = self.comm.Get_rank() if mpi is not None else 0
        self.size = self.comm.Get_size() if mpi is not None else 1
        self.local_size = 1
        if mpi is not None:
            node = self.comm.Split_type(mpi.COMM_TYPE_SHARED)   # the ranks sharing this machine
            self.local_size = node.Get_size()
            node.Free()
        self.watch = _Watchdog(self, timeout) if self.size > 1 else None

    def abort(self, code: int) -> None:
        """End every rank: ``MPI_Abort`` (from any thread when MPI is thread-safe).

        The launcher forwards a rank's stderr through its proxy, and ``MPI_Abort`` ends the
        proxies at once: text still in the pipe is lost (measured: the abort message missing in
        1 of 15 runs). ``ABORT_GRACE_S`` of waiting after the flush lets it reach the terminal.
        """
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        time.sleep(ABORT_GRACE_S)
        if threading.current_thread() is threading.main_thread() or \
                self.mpi.Query_thread() == self.mpi.THREAD_MULTIPLE:
            self.mpi.COMM_WORLD.Abort(code)
        os._exit(code)      # a rank that exits without MPI_Finalize makes the launcher end the job

    def wait(self, what: str, call, *args):
        """``call(*args)``, a blocking collective, watched by the watchdog as ``what``."""
        if self.watch is None:
            return call(*args)
        self.watch.pending = (what, time.monotonic())
        try:
            return call(*args)
        finally:
            self.watch.pending = None


_STATE = {"world": None}
_LOCK = threading.Lock()


def _report(world, message: str) -> None:
    """Write ``message`` to stderr, best effort: a dead launcher leaves a broken pipe."""
    try:
        sys.stderr.write(f"miniflow.distributed: rank {world.rank} of {world.size}: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _excepthook(exc_type, exc, tb) -> None:
    """Print the uncaught exception with the rank on every line, then abort every rank."""
    world = _STATE["world"]
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    _report(world, f"uncaught {exc_type.__name__}; aborting all {world.size} ranks (MPI_Abort)\n"
            + "".join(f"[rank {world.rank}] {line}\n" for line in text.splitlines()).rstrip())
    world.abort(1)


def _timeout(timeout) -> float:
    if timeout is None:
        return read("MINIFLOW_DIST_TIMEOUT", DEFAULT_TIMEOUT_S)
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise ValueError(f"miniflow.distributed.init: the collective timeout (init(timeout=...)) "
                         f"must be a positive number of seconds, got {timeout!r}")
    return value


def _launcher_size():
    """``(started by a launcher, the world size it announced or None)``."""
    launched = any(v in os.environ for v in _LAUNCHER_VARS)
    sizes = [os.environ[v] for v in _SIZE_VARS if v in os.environ]
    return launched, (int(sizes[0]) if sizes and sizes[0].isdigit() else None)


def announced_world_size() -> int | None:
    """The world size a launcher (``mpiexec -n N``) announced in this process's environment
    (``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``), without starting MPI; None when it announced none
    (no launcher, or one that does not say)."""
    return _launcher_size()[1]


def init(timeout: float | None = None) -> None:
    """Set up the process world; idempotent (later calls only change ``timeout`` when given).

    Under an MPI launcher (``mpiexec -n N``) the world is MPI's ``COMM_WORLD`` through mpi4py,
    and for N > 1 the failure handling of the module docstring is installed. Otherwise the world
    is this process alone (rank 0 of 1) and MPI is not imported.

    Args:
        timeout: seconds a collective may wait for the other ranks before the job is aborted
            (default ``MINIFLOW_DIST_TIMEOUT`` or 600).

    Raises:
        ValueError: ``timeout`` (or ``MINIFLOW_DIST_TIMEOUT``) is not a positive number.
        RuntimeError: a launcher started N > 1 processes but mpi4py is not installed, or mpi4py's
            MPI sees another world size than the launcher announced (an ``mpiexec`` of another MPI
            implementation than the one mpi4py was built with).
    """
    seconds = _timeout(timeout)
    with _LOCK:
        world = _STATE["world"]
        if world is not None:
            if timeout is not None and world.watch is not None:
                world.watch.timeout = seconds
            return
        launched, announced = _launcher_size()
        mpi = None
        if launched:
            try:
                from mpi4py import MPI as mpi
            except ImportError as e:
                if announced != 1:
                    raise RuntimeError(
                        f"miniflow.distributed.init: this process was started by an MPI launcher "
                        f"(world size {announced or 'unknown'}) but mpi4py is not installed, so "
                        f"every process would train alone as rank 0; install the dist extra: "
                        f"pip install 'miniflow[dist]'") from e
            if mpi is not None and announced is not None and mpi.COMM_WORLD.Get_size() != announced:
                raise RuntimeError(
                    f"miniflow.distributed.init: the launcher started {announced} processes but "
                    f"mpi4py's MPI ({mpi.Get_library_version().splitlines()[0].strip()}) sees a "
                    f"world of {mpi.COMM_WORLD.Get_size()}: the mpiexec that started them belongs "
                    f"to another MPI implementation; use the mpiexec installed with mpi4py's MPI "
                    f"(the dist extra installs MPICH's next to python)")
        world = _World(mpi, seconds)
        if world.size > 1:
            sys.excepthook = _excepthook
        _STATE["world"] = world


def is_initialized() -> bool:
    """Whether :func:`init` has run."""
    return _STATE["world"] is not None


def _world(caller: str) -> _World:
    world = _STATE["world"]
    if world is None:
        raise RuntimeError(f"miniflow.distributed.{caller}: the process world is not set up; "
                           f"call miniflow.distributed.init() first")
    return world


def rank() -> int:
    """This process's rank in ``[0, world_size())``. Raises RuntimeError before :func:`init`."""
    return _world("rank").rank


def world_size() -> int:
    """The number of processes (1 without a launcher). Raises RuntimeError before :func:`init`."""
    return _world("world_size").size


def get_rank() -> int:
    """``torch.distributed.get_rank()``: :func:`rank`."""
    return _world("get_rank").rank


def get_world_size() -> int:
    """``torch.distributed.get_world_size()``: :func:`world_size`."""
    return _world("get_world_size").size


TORCH_BACKENDS = ("mpi", "gloo", "nccl")
"""The ``backend`` names :func:`init_process_group` takes: miniflow's transport is MPI whatever
PyTorch's would be (nanoGPT passes ``"nccl"``)."""


def init_process_group(backend: str | None = None, *, timeout=None, world_size: int = -1,
                       rank: int = -1, **others) -> None:
    """``torch.distributed.init_process_group``: :func:`init` over MPI, for the ranks
    ``mpiexec`` started (torchrun's environment is not read). ``backend`` may name PyTorch's
    (``"nccl"``, ``"gloo"``, ``"mpi"``: all run on MPI here); ``timeout`` is seconds or a
    ``datetime.timedelta``; ``world_size`` and ``rank``, when given, must be MPI's.

    Raises:
        ValueError: another backend, a world size or rank that is not MPI's, an argument
            miniflow has no use for (``init_method``, ``store`` ...: MPI's launcher sets the
            world up). Else as :func:`init`."""
    if others:
        raise ValueError(f"init_process_group: {sorted(others)} are not taken: miniflow's world "
                         f"is the ranks mpiexec started (mpiexec -n N python script.py)")
    if backend is not None and str(backend).lower() not in TORCH_BACKENDS:
        raise ValueError(f"init_process_group: backend {backend!r} is not one of "
                         f"{TORCH_BACKENDS} (miniflow runs every one on MPI)")
    init(timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout)
    for name, given, actual in (("world_size", world_size, get_world_size()),
                                ("rank", rank, get_rank())):
        if given != -1 and given != actual:
            raise ValueError(f"init_process_group: {name}={given} but mpiexec started this "
                             f"process as {name} {actual}; leave {name} out")


def destroy_process_group() -> None:
    """``torch.distributed.destroy_process_group()``: nothing to do: MPI ends the world when
    the process exits (it cannot be set up again in one process)."""


def abort(code: int = 1) -> None:
    """End every rank now with exit code ``code`` (``MPI_Abort``), saying which rank asked; for a
    rank that fails without an uncaught exception (an exit code, which the launcher would only see
    after the other ranks' collectives timed out). Does nothing in a one-rank world or before
    :func:`init`: the caller then exits as it would have.
    """
    world = _STATE["world"]
    if world is None or world.size == 1:
        return
    _report(world, f"exiting with code {code}; aborting all {world.size} ranks (MPI_Abort)")
    world.abort(code)


def local_world_size() -> int:
    """The number of ranks on this machine (those sharing its memory, MPI's
    ``COMM_TYPE_SHARED``); 1 without a launcher. Divide the cores by it to give every rank its own
    (``miniflow train --ddp`` does: MPICH busy-polls while a rank waits, so ranks must not share
    cores with each other's thread pools).

    Raises:
        RuntimeError: before :func:`init`.
    """
    return _world("local_world_size").local_size


def barrier() -> None:
    """Wait until every rank has called ``barrier()``; a no-op in a one-rank world.

    Meant for rare synchronisation (e.g. while rank 0 writes files): the wait sleeps (a polled
    ``MPI_Ibarrier``, backing off to 10 ms) instead of MPICH's busy polling, so a waiting rank
    costs no CPU, at a latency of about 10 ms. Watched by the collective timeout.

    Raises:
        RuntimeError: before :func:`init`.
    """
    world = _world("barrier")
    if world.comm is None:
        return
    request = world.control.Ibarrier()
    world.wait("barrier()", _sleep_until_done, request)


def _sleep_until_done(request) -> None:
    delay = 1e-4
    while not request.Test():
        time.sleep(delay)
        delay = min(2 * delay, 0.01)


def broadcast_object(obj, what: str, root: int = 0):
    """Rank ``root``'s ``obj`` (a small picklable object) on every rank; the other ranks' ``obj``
    is not used. ``obj`` itself in a one-rank world or before :func:`init`. Collective: every
    rank must call it, in the same order. The ranks first meet in a sleeping barrier (as
    :func:`barrier`'s: a rank that waits while ``root`` works, e.g. measures kernels, takes no
    core from it), then ``root`` sends; watched by the collective timeout as ``what``."""
    world = _STATE["world"]
    if world is None or world.comm is None:
        return obj
    what = f"broadcast_object({what})"
    world.wait(what, _sleep_until_done, world.control.Ibarrier())
    return world.wait(what, world.control.bcast, obj, root)


# ----------------------------------------------------------------------------- consistency
_SAME_GRAPH = ("Every rank must build the same graph (the same model, parameter shapes and "
               "dtypes, input shapes and config).")


def check_same_across_ranks(signature: str, what: str, advice: str = _SAME_GRAPH) -> None:
    """Raise on every rank unless every rank passed the same ``signature``.

    The ranks exchange a SHA-256 digest of ``signature``; only when the digests differ do they
    exchange the signatures themselves, to name the difference. Collective: every rank must call
    it. A no-op in a one-rank world.

    Args:
        signature: one item per line, e.g. ``"fc1.weight f32[128, 64]"`` per parameter.
        what: what the signature describes, for the message (e.g. ``"parameters of graph G"``).
        advice: the message's last sentence, what to do (by default: build the same graph).

    Raises:
        RankMismatchError: on every rank, naming each rank whose signature differs from rank 0's,
            the first differing item (its number and both versions) or the item counts.
        TypeError: ``signature`` or ``what`` is not a str.
    """
    for name, value in (("signature", signature), ("what", what), ("advice", advice)):
        if not isinstance(value, str):
            raise TypeError(f"check_same_across_ranks: {name} must be a str, got "
                            f"{type(value).__name__}")
    world = _world("check_same_across_ranks")
    if world.comm is None:
        return
    digest = hashlib.sha256(signature.encode()).digest()
    digests = world.wait(f"check_same_across_ranks({what})", world.control.allgather, digest)
    if all(d == digests[0] for d in digests):
        return
    signatures = world.wait(f"check_same_across_ranks({what})", world.control.allgather,
                            signature)
    ref = signatures[0].splitlines()
    parts = []
    for r, (sig, d) in enumerate(zip(signatures, digests)):
        if d == digests[0]:
            continue
        items = sig.splitlines()
        k = next((i for i, (a, b) in enumerate(zip(ref, items)) if a != b), None)
        if k is not None:
            parts.append(f"rank {r} differs from rank 0 at item {k + 1}: rank {r} has "
                         f"{items[k]!r}, rank 0 has {ref[k]!r}")
        elif len(items) != len(ref):
            longer, who = (items, f"rank {r}") if len(items) > len(ref) else (ref, "rank 0")
            parts.append(f"rank {r} has {len(items)} items, rank 0 has {len(ref)} (the first "
                         f"item only {who} has: {longer[min(len(items), len(ref))]!r})")
        else:
            parts.append(f"rank {r}'s signature differs from rank 0's in its line breaks")
    raise RankMismatchError(f"the {what} differ across the {world.size} ranks: "
                            + "; ".join(parts) + ". " + advice)


def check_same_values(values, labels, what: str, advice: str = _SAME_GRAPH) -> None:
    """Raise on every rank unless every rank passed the same numbers:
    :func:`check_same_across_ranks` for values checked at every step, at the cost of one
    :func:`same_values` all-reduce; only when they differ are the items named and exchanged.
    Collective. A no-op in a one-rank world.

    Args:
        values: floats, in the same order on every rank; NaN is not a value to compare.
        labels: ``() -> [str]``, a name per value (``"optimizer 0 group 0 lr"``), called only
            when the values differ (nothing is formatted on the steps that agree).
        what, advice: as for :func:`check_same_across_ranks`.

    Raises:
        RankMismatchError: on every rank, naming the first label whose number differs from
            rank 0's.
    """
    v = list(values)
    if same_values(v, "check_same_values"):
        return
    check_same_across_ranks("\n".join(f"{k}={x!r}" for k, x in zip(labels(), v)), what, advice)


def same_values(values, what: str = "same_values") -> bool:
    """Whether every rank passed the same numbers: one ``MPI_Allreduce`` (MAX) of the numbers and
    their negatives (item by item, the largest and the smallest across the ranks: the same
    exactly where they are equal; 5.6 us a call on 2 ranks of one Zen 4 machine, the
    ``MPI_Allreduce`` 3.4 of them, where a digests' all-gather added 70 us to a step). Every rank
    gets the same answer, so every rank takes the same branch after it. Collective: every rank
    passes as many numbers (MPI needs equal counts). True in a one-rank world (no MPI call).

    Args:
        values: floats; NaN is not a value to compare.
        what: the collective's name for the watchdog's message.

    Raises:
        RuntimeError: before :func:`init`.
    """
    world = _world("same_values")
    if world.comm is None:
        return True
    v = list(values)
    both = np.array(v + [-x for x in v], np.float64)
    world.wait(what, world.control.Allreduce, world.mpi.IN_PLACE, [both, world.mpi.DOUBLE],
               world.mpi.MAX)
    return both[:len(v)].tolist() == (-both[len(v):]).tolist()


def all_gather_object(obj, what: str) -> list:
    """Every rank's ``obj`` (small and picklable), in rank order: ``[obj]`` in a one-rank world.
    Collective; watched by the collective timeout as ``what``. For the rare path that names a
    disagreement :func:`same_values` found.

    Raises:
        RuntimeError: before :func:`init`.
    """
    world = _world("all_gather_object")
    if world.comm is None:
        return [obj]
    return world.wait(f"all_gather_object({what})", world.control.allgather, obj)


# ----------------------------------------------------------------------------- buckets
def compute_bucket_assignment_by_size(specs, bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB):
    """Group arrays into all-reduce buckets: PyTorch DDP's rule
    (``torch.distributed._compute_bucket_assignment_by_size`` with one size limit).

    Arrays are taken in order and go to the open bucket of their dtype; a bucket closes once it
    holds ``bucket_cap_mb`` MiB or more (so one array larger than the cap gets a bucket of its
    own). Buckets are ordered by their first array. DDP passes its parameters in reverse order,
    the order backward produces their gradients; PyTorch's smaller first bucket (1 MiB, for early
    overlap with backward) is left out: miniflow's plan runs the all-reduces after backward.

    Args:
        specs: ``(shape, dtype)`` per array (a dtype NumPy accepts).
        bucket_cap_mb: the cap in MiB (> 0).

    Returns:
        ``list[list[int]]``: the indices into ``specs`` of every bucket.

    Raises:
        ValueError: ``bucket_cap_mb`` is not a positive number.
    """
    if not isinstance(bucket_cap_mb, (int, float)) or isinstance(bucket_cap_mb, bool) or \
            not bucket_cap_mb > 0 or math.isinf(bucket_cap_mb):
        raise ValueError(f"compute_bucket_assignment_by_size: bucket_cap_mb must be a positive "
                         f"number of MiB, got {bucket_cap_mb!r}")
    cap = int(bucket_cap_mb * 1024 * 1024)
    closed, open_ = [], {}
    for i, (shape, dtype) in enumerate(specs):
        dtype = np.dtype(dtype)
        indices, size = open_.get(dtype, ([], 0))
        indices.append(i)
        size += math.prod(shape) * dtype.itemsize
        if size >= cap:
            closed.append(indices)
            open_.pop(dtype, None)
        else:
            open_[dtype] = (indices, size)
    closed += [indices for indices, _ in open_.values()]
    return sorted(closed, key=lambda b: b[0])


# ----------------------------------------------------------------------------- steps
def _host_arrays(caller: str, arrays, dtypes=None, writeable: bool = True) -> list:
    """``arrays`` as a list, each a C-contiguous, writeable NumPy array (of ``dtypes``)."""
    if isinstance(arrays, np.ndarray):
        arrays = [arrays]
    arrays = list(arrays)
    if not arrays:
        raise ValueError(f"{caller}: got no arrays")
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{caller}: array {i} is a {type(a).__module__}.{type(a).__name__}, "
                            f"not a NumPy array; collectives run on host memory (stage device "
                            f"arrays through host buffers)")
        if not a.flags.c_contiguous:
            raise ValueError(f"{caller}: array {i} (shape {list(a.shape)}, strides {a.strides}) "
                             f"is not C-contiguous; pass contiguous buffers")
        if writeable and not a.flags.writeable:
            raise ValueError(f"{caller}: array {i} (shape {list(a.shape)}) is read-only; the "
                             f"collective writes its result into it")
        if dtypes is not None and a.dtype.name not in dtypes:
            raise TypeError(f"{caller}: array {i} has dtype {a.dtype}, expected "
                            f"{' or '.join(map(str, dtypes))}")
    return arrays


def _nbytes(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MiB" if n >= 2 ** 20 else f"{n} bytes"


def _outputs(caller: str, arrays: list, out) -> list:
    """``out`` checked against ``arrays`` (same count, shapes and dtypes); ``arrays`` if None."""
    if out is None:
        return arrays
    outs = _host_arrays(caller, out)
    if len(outs) != len(arrays):
        raise ValueError(f"{caller}: got {len(arrays)} arrays but {len(outs)} outputs")
    for i, (a, o) in enumerate(zip(arrays, outs)):
        if a.shape != o.shape or a.dtype != o.dtype:
            raise ValueError(f"{caller}: output {i} is {o.dtype}{list(o.shape)} but array {i} is "
                             f"{a.dtype}{list(a.shape)}")
    return outs


def allreduce_mean_step(buffers, out=None):
    """A plan step that averages one bucket of arrays across ranks, in their dtype: in place, or
    into ``out``.

    Planned once: the arrays' offsets in one contiguous staging buffer, so a call is copy-in,
    one ``MPI_Allreduce`` (sum), a division by the world size, copy-out. float32 and float64 go
    without a staging buffer or copies when they are a single array (reduced in place, or straight
    into its output) or, reduced in place, when they lie back to back in one array's memory: a
    plan that allocates a bucket's gradients as views of one buffer (PyTorch DDP's
    ``gradient_as_bucket_view``) all-reduces that buffer directly.

    Numerics: float32 and float64 are summed in their dtype, then divided by the world size: for 2
    ranks that is ``np.mean`` over the ranks' arrays, bit for bit. MPI has no float16 sum, so a
    float16 (or bfloat16) bucket is widened exactly to a float32 staging buffer, summed and
    divided in float32 and rounded once to its type (round to nearest even) - NumPy's own ``np.mean`` of float16
    arrays (float32 intermediates), and no spurious overflow: two gradients of 60000 average to
    60000, not to inf. inf and NaN propagate as in float16 arithmetic. Every rank rounds the same
    float32 sum the same way, so the result is bitwise identical on every rank whenever MPI
    returns every rank the same sum (MPICH does: float addition is commutative and each element
    is reduced in one order; tested with 2 and 3 ranks). The float16 bucket travels as float32
    (twice the bytes) and NumPy's float16 conversions are slow (about 2 ns an element); a plan can
    instead cast to float32 with its own kernels and all-reduce float32.

    Args:
        buffers: C-contiguous NumPy arrays, all of one dtype (float16, bfloat16 (``ml_dtypes``),
            float32 or float64), of any
            shapes; typically a bucket from :func:`compute_bucket_assignment_by_size`.
        out: None (average ``buffers`` in place, so they must be writeable) or C-contiguous,
            writeable arrays of the same count, shapes and dtypes, which receive the means
            (``buffers`` are then only read).

    Returns:
        ``(fn, ())``; ``fn`` (named ``all_reduce_mean``) is collective: every rank calls it with
        arrays of the same dtypes and sizes, in the same order of steps.

    Raises:
        RuntimeError: before :func:`init`.
        TypeError: an array is not a NumPy array, or not float16/bfloat16/float32/float64, or the
            dtypes differ.
        ValueError: no arrays, an array is not C-contiguous, a written array is read-only, or
            ``out`` does not match ``buffers``.
    """
    return _allreduce_step("allreduce_mean_step", buffers, out, _MEAN_DTYPES, mean=True)


def allreduce_sum_int64_step(buffers, out=None):
    """A plan step that sums one bucket of int64 arrays across ranks, in place or into ``out``
    (the non-finite gradient counts: after it every rank sees the same counts, so every rank
    skips the same steps). Planned like :func:`allreduce_mean_step`: a single array goes without
    staging, several through one staging buffer and one ``MPI_Allreduce``.

    Args:
        buffers: a C-contiguous int64 NumPy array, or a list of them, of any shapes (writeable
            unless ``out`` is given).
        out: None (sum in place) or C-contiguous, writeable int64 arrays matching ``buffers``.

    Returns:
        ``(fn, ())``; ``fn`` (named ``all_reduce_sum``) is collective.

    Raises:
        RuntimeError: before :func:`init`.
        TypeError: an array is not a NumPy int64 array.
        ValueError: no arrays, an array is not C-contiguous, a written array is read-only, or
            ``out`` does not match ``buffers``.
    """
    return _allreduce_step("allreduce_sum_int64_step", buffers, out, ("int64",),
                           mean=False)


def _allreduce_step(caller: str, buffers, out, dtypes, mean: bool):
    """The step of :func:`allreduce_mean_step` (``mean``) and :func:`allreduce_sum_int64_step`."""
    world = _world(caller)
    arrays = _host_arrays(caller, buffers, dtypes, writeable=out is None)
    dtype = arrays[0].dtype
    odd = [i for i, a in enumerate(arrays) if a.dtype != dtype]
    if odd:
        raise TypeError(f"{caller}: a bucket holds one dtype; array 0 is {dtype} but "
                        f"array {odd[0]} is {arrays[odd[0]].dtype} (group the arrays with "
                        f"compute_bucket_assignment_by_size)")
    outs = _outputs(caller, arrays, out)
    name = "all_reduce_mean" if mean else "all_reduce_sum"

    if world.comm is None:                      # the mean (sum) over one rank is the array itself
        copies = tuple((o, a) for a, o in zip(arrays, outs) if o is not a)

        def one_rank():
            for dst, src in copies:
                np.copyto(dst, src)
        one_rank.__name__ = one_rank.__qualname__ = name
        return one_rank, ()

    mpi, comm, n = world.mpi, world.comm, world.size
    wire = np.dtype(np.float32) if dtype.name in _HALF else dtype
    srcs, dsts = [a.reshape(-1) for a in arrays], [o.reshape(-1) for o in outs]
    span = _span(srcs) if out is None and wire == dtype else None
    if span is not None:                    # the arrays are one bucket's views already
        send, bucket, staged = mpi.IN_PLACE, span, ()
    elif len(srcs) == 1 and wire == dtype:
        send = mpi.IN_PLACE if out is None else [srcs[0], _mpi_type(mpi, wire)]
        bucket, staged = dsts[0], ()
    else:
        send = mpi.IN_PLACE
        bucket = np.empty(sum(f.size for f in srcs), wire)
        offsets = np.cumsum([0] + [f.size for f in srcs])
        staged = tuple((src, bucket[o:o + src.size], dst)
                       for src, dst, o in zip(srcs, dsts, offsets) if src.size)
    receive = [bucket, _mpi_type(mpi, wire)]
    what = f"{name}({dtype}, {len(arrays)} arrays, {_nbytes(sum(a.nbytes for a in arrays))})"
    total, copyto, divide = mpi.SUM, np.copyto, np.divide

    def step():
        for src, part, _ in staged:
            copyto(part, src)
        world.wait(what, comm.Allreduce, send, receive, total)
        if mean:
            divide(bucket, n, out=bucket)
        for _, part, dst in staged:
            copyto(dst, part, casting="unsafe")   # float32 -> half: round to nearest even
    step.__name__ = step.__qualname__ = name
    return step, ()


def _span(flats: list):
    """One flat array over ``flats`` when they lie back to back, in order, in the memory of one
    array (views of one bucket, PyTorch DDP's ``gradient_as_bucket_view``); else None."""
    flats = [f for f in flats if f.size]
    if not flats:
        return None
    roots = []
    for f in flats:
        while isinstance(f.base, np.ndarray):
            f = f.base
        roots.append(f)
    root = roots[0]
    start = flats[0].__array_interface__["data"][0]
    end = start
    for f, r in zip(flats, roots):
        if r is not root or f.__array_interface__["data"][0] != end:
            return None
        end += f.nbytes
    if not root.flags.c_contiguous:
        return None
    offset = start - root.__array_interface__["data"][0]
    return np.ndarray((end - start) // flats[0].itemsize, flats[0].dtype, buffer=root,
                      offset=offset)


def _mpi_type(mpi, dtype: np.dtype):
    return {np.dtype(np.float32): mpi.FLOAT, np.dtype(np.float64): mpi.DOUBLE,
            np.dtype(np.int64): mpi.INT64_T}[dtype]


def broadcast_step(arrays, root: int = 0):
    """A plan step that overwrites ``arrays`` on every rank with ``root``'s (their bytes: any
    dtype), e.g. the parameters and optimizer state at the first compile.

    Args:
        arrays: C-contiguous NumPy arrays (writeable on the ranks other than ``root``).
        root: the rank whose arrays are sent, in ``[0, world_size())``.

    Returns:
        ``(fn, ())``; ``fn`` (named ``broadcast``) is collective: every rank passes arrays of the
        same sizes and dtypes. The identity in a one-rank world.

    Raises:
        RuntimeError: before :func:`init`.
        TypeError: an array is not a NumPy array.
        ValueError: no arrays, an array is not C-contiguous or (off the root) read-only, or
            ``root`` is not a rank.
    """
    world = _world("broadcast_step")
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
            not 0 <= root < world.size:
        raise ValueError(f"broadcast_step: root must be a rank in [0, {world.size - 1}], "
                         f"got {root!r}")
    arrays = _host_arrays("broadcast_step", arrays, writeable=world.rank != root)

    if world.comm is None:
        def broadcast():
            return None
        return broadcast, ()

    mpi, comm, root = world.mpi, world.comm, int(root)
    messages = tuple([a.reshape(-1).view(np.uint8), mpi.BYTE] for a in arrays)
    what = f"broadcast(root {root}, {len(arrays)} arrays, {_nbytes(sum(a.nbytes for a in arrays))})"

    def broadcast():
        for message in messages:
            world.wait(what, comm.Bcast, message, root)

    return broadcast, ()
