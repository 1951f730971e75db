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
lock: both files are replaced atomically. Compilations themselves stay concurrent (two processes
may compile the same kernel; both then save the same machine code under one key).
Where ``fcntl`` does not exist (Windows), nothing is replaced. numba-cuda's cache (a copy of the
same class, used for CUDA kernels on a GPU only) is left as it is.
"""
from __future__ import annotations

import contextlib
import itertools
import os

from numba.core import caching

try:
    import fcntl
except ImportError:             # Windows: no flock
    fcntl = None

__all__ = ["LOCK_NAME", "locked_save", "install"]

LOCK_NAME = "miniflow-cache.lock"
"""The lock file :func:`locked_save` creates in each cache folder it saves to."""


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


def install() -> bool:
    """Make every Numba cache save of this process :func:`locked_save` (idempotent); False where
    ``fcntl`` is missing and nothing was replaced."""
    if fcntl is None:
        return False
    caching.IndexDataCacheFile.save = locked_save
    return True
