"""Numba's disk cache written by several processes at once: each save under a file lock.

Numba keeps a cached function's compiled overloads in numbered data files (``<name>.<N>.nbc``)
listed by an index (``<name>.nbi``: key -> data file). Each file is replaced atomically, but a
save, ``IndexDataCacheFile.save`` (``numba/core/caching.py``), reads the index, picks the first
free number, writes the index and then the data, without a lock. Two processes that compile two
signatures of one kernel at the same moment (``pytest -n 2``, the ranks of ``mpiexec -n 2`` on a
cold cache, two ``miniflow train`` runs) can thus pick the same number: one overload is lost, or,
when the writes interleave, the index gives one signature's key the other signature's machine
code, which a later process loads and calls with the wrong argument types.

:func:`install` replaces that method by :func:`locked_save`, the same steps under an exclusive
``fcntl.flock`` on ``<cache folder>/miniflow-cache.lock`` (one per cache folder; a save takes
milliseconds) and with the data written before the index, so a reader never finds an index
entry whose data file is missing or left over from an older version of the source. Loads take no
lock: both files are replaced atomically.

Compile once, then read: a process that misses the cache for a kernel's signature first waits
while another process compiles that same signature (``Cache.load_overload``, then
``Dispatcher.compile``, in ``numba/core/caching.py`` and ``numba/core/dispatcher.py``), and
looks again when the other has saved it. :func:`install` makes a miss take a POSIX record lock
(``fcntl.lockf``) on one byte of ``<cache folder>/miniflow-compile.lock``, at an offset hashed
from the cache's index key (the function's file, line, bytecode, closure, the signature and the
CPU target), and hold it until the compilation that follows has saved its result or failed. Two
pytest-xdist workers, two MPI ranks or the simulator lane's shards that need the same kernels on
a cold cache thus compile each once: the other process sleeps (no CPU) and loads it. Different
kernels still compile at once. A kernel whose compilation calls another (a helper) takes the
helper's lock inside its own, in the order of the call graph, which has no cycles; a wait is
given up after :data:`WAIT_S` seconds all the same (the process then compiles it too, as Numba
alone would).
Where ``fcntl`` does not exist (Windows), nothing is replaced. numba-cuda's cache (a copy of the
same class, used for CUDA kernels on a GPU only) is left as it is.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import threading
import time

from numba.core import caching, dispatcher

try:
    import fcntl
except ImportError:             # Windows: no flock
    fcntl = None

__all__ = ["LOCK_NAME", "COMPILE_LOCK_NAME", "WAIT_S", "locked_save", "CompileLock",
           "install"]

LOCK_NAME = "miniflow-cache.lock"
"""The lock file :func:`locked_save` creates in each cache folder it saves to."""
COMPILE_LOCK_NAME = "miniflow-compile.lock"
"""The file whose bytes :class:`CompileLock` locks, one per cache folder (it stays empty)."""
WAIT_S = 300.0
"""Seconds a process waits for another's compilation of a kernel before compiling it too."""


@contextlib.contextmanager
def _folder_locked(folder: str):
    """Hold an exclusive ``flock`` on ``folder/LOCK_NAME`` (created if missing) in the block."""
    fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                # closing releases the lock


def locked_save(self: caching.IndexDataCacheFile, key, data) -> None:
    """``IndexDataCacheFile.save`` under the cache folder's lock: read the index, take the key's
    data file or the first free number, write the data, then the index (when it changed)."""
    with _folder_locked(self._cache_path):
        overloads = self._load_index()
        data_name = overloads.get(key)
        if data_name is not None:
            self._save_data(data_name, data)
            return
        taken = set(overloads.values())
        data_name = next(name for name in map(self._data_name, itertools.count(1))
                         if name not in taken)
        self._save_data(data_name, data)
        overloads[key] = data_name
        self._save_index(overloads)


class CompileLock:
    """The lock on compiling one cache key: one byte of ``<cache folder>/COMPILE_LOCK_NAME``,
    locked with ``fcntl.lockf`` (POSIX record locks: many independent ones in one file; the
    system drops a process's locks when it exits, so a crashed compiler blocks no one).

    Args:
        cache: the function's ``numba.core.caching.Cache``.
        sig: the signature being compiled, as the dispatcher passes it to the cache.
        codegen: the target's code generator (its ``magic_tuple`` names the CPU).
    """

    _files: dict = {}
    """Cache folder -> the lock file's descriptor, open for the life of the process (closing any
    descriptor of the file would drop every lock this process holds on it)."""
    _files_lock = threading.Lock()

    def __init__(self, cache: caching.Cache, sig, codegen):
        key = repr((cache._cache_file._index_name, cache._index_key(sig, codegen)))
        self.offset = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little") >> 1
        self.folder = cache._cache_path
        self.held = False

    def _fd(self) -> int:
        with self._files_lock:
            fd = self._files.get(self.folder)
            if fd is None:
                fd = os.open(os.path.join(self.folder, COMPILE_LOCK_NAME),
                             os.O_RDWR | os.O_CREAT, 0o666)
                self._files[self.folder] = fd
            return fd

    def acquire(self, wait_s: float = WAIT_S) -> bool:
        """Take the lock, polling while another process holds it; False after ``wait_s``
        seconds without it (or when the file cannot be made)."""
        try:
            fd = self._fd()
        except OSError:
            return False
        deadline, pause = time.monotonic() + wait_s, 0.005
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, self.offset, os.SEEK_SET)
                self.held = True
                return True
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):    # no record locks here
                    return False
                if time.monotonic() >= deadline:    # another process compiles this key
                    return False
                time.sleep(pause)
                pause = min(2 * pause, 0.1)

    def release(self) -> None:
        if self.held:
            fcntl.lockf(self._fd(), fcntl.LOCK_UN, 1, self.offset, os.SEEK_SET)
            self.held = False


_compiling = threading.local()
"""``stack``: one list per ``Dispatcher.compile`` call in progress on this thread, of the
:class:`CompileLock` s its cache miss took."""


def _stack() -> list:
    if not hasattr(_compiling, "stack"):
        _compiling.stack = []
    return _compiling.stack


def _compile_then_release(compile_):
    def compile(self, sig):
        stack = _stack()
        stack.append([])
        try:
            return compile_(self, sig)
        finally:
            for lock in stack.pop():
                lock.release()
    compile._miniflow_compile_once = True
    return compile


def _load_or_wait(load):
    def load_overload(self, sig, target_context):
        data = load(self, sig, target_context)
        stack = _stack()
        if data is not None or not stack or not self._enabled:
            return data
        lock = CompileLock(self, sig, target_context.codegen())
        if lock.acquire():
            data = load(self, sig, target_context)  # saved by the process that held the lock?
            if data is None:
                stack[-1].append(lock)      # held until this compilation has saved or failed
            else:
                lock.release()
        return data
    load_overload._miniflow_compile_once = True
    return load_overload


def install() -> bool:
    """Make every Numba cache save of this process :func:`locked_save`, and a cache miss wait for
    another process's compilation of the same key (:class:`CompileLock`); idempotent. False
    where ``fcntl`` is missing and nothing was replaced."""
    if fcntl is None:
        return False
    caching.IndexDataCacheFile.save = locked_save
    if not hasattr(caching.Cache.load_overload, "_miniflow_compile_once"):
        caching.Cache.load_overload = _load_or_wait(caching.Cache.load_overload)
    if not hasattr(dispatcher.Dispatcher.compile, "_miniflow_compile_once"):
        dispatcher.Dispatcher.compile = _compile_then_release(dispatcher.Dispatcher.compile)
    return True
