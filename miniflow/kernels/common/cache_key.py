"""Numba's disk-cache key of a kernel, extended with the miniflow sources compiled into it from
other files.

Numba keys a cached function by its own source file (the index is dropped when that file's
modification time or size changes), its bytecode and its closure's cells, pickled: a plain
function by its module and name (``Cache._index_key`` in ``numba/core/caching.py``). Code that a
kernel compiles in from elsewhere is not part of the key: the scalar function of ``miniflow.ops``
it closes over (``map_kernel(gelu)``), the functions that one calls, the jitted helpers of other
modules (``fp16.load``; a CUDA kernel's device functions) and the Numba overloads registered for
any of them (``kernels/cpu/special.py``'s float32 ``gelu``). A cache written by
another version of those files was therefore loaded as current: after an edit of ``special.py``
the float32 gelu kernels kept the previous polynomial, and ``tests/test_kernels_cpu_special.py``
failed with that cache and passed with an empty one (what looked like an interaction with the
PTX and ISA lanes in a ``pytest -n 2`` run).

:func:`install` appends to every key a digest of the contents of the files of the miniflow
modules the function reaches (:func:`dependency_files`): the function's own file, and
transitively every plain function or Numba dispatcher in a closure cell or named by a global
(also ``module.name``), and the functions of the overloads registered for them in the CPU typing
context. Functions outside the miniflow package (NumPy, Numba, ``math``) are not followed: their
versions are Numba's concern. A source edit thus makes the kernels that compile it in miss the
cache and compile again; unchanged sources keep their cache entries across processes.
"""
from __future__ import annotations

import functools
import hashlib
import os
import types

from numba.core import caching

__all__ = ["PACKAGE_DIR", "dependency_files", "dependency_digest", "install"]

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The ``miniflow`` package folder: the files whose functions :func:`dependency_files`
follows."""


def _code_names(code: types.CodeType) -> set:
    """The global and attribute names ``code`` and the code objects nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _overload_functions(fn) -> list:
    """The ``@overload`` functions registered for ``fn`` in the CPU typing context (the
    functions that return an implementation per argument types)."""
    from numba.core.registry import cpu_target
    ctx = cpu_target.typing_context
    ctx.refresh()
    fnty = ctx._lookup_global(fn)
    return [t._overload_func for t in getattr(fnty, "templates", ())
            if hasattr(t, "_overload_func")]


def _inside_package(path: str) -> bool:
    return os.path.abspath(path).startswith(PACKAGE_DIR + os.sep)


def dependency_files(py_func) -> list:
    """The sorted source files of the miniflow functions compiled into ``py_func`` (see the
    module docstring), ``py_func``'s own file first."""
    files, seen, todo = [py_func.__code__.co_filename], set(), [py_func]
    while todo:
        fn = todo.pop()
        fn = getattr(fn, "py_func", fn)            # a CPU or CUDA dispatcher: its function
        if not isinstance(fn, types.FunctionType) or fn in seen:
            continue
        seen.add(fn)
        if fn is not py_func and not _inside_package(fn.__code__.co_filename):
            continue
        files.append(fn.__code__.co_filename)
        reached = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
        names = _code_names(fn.__code__)
        for name in names:
            obj = fn.__globals__.get(name)
            if isinstance(obj, types.ModuleType):
                reached += [getattr(obj, n) for n in names if hasattr(obj, n)]
            elif obj is not None:
                reached.append(obj)
        for obj in reached:
            todo.append(obj)
            if isinstance(obj, types.FunctionType):
                todo += _overload_functions(obj)
    return [files[0]] + sorted(set(files[1:]) - {files[0]})


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:                      # an empty cell
        return False
    return True


@functools.cache
def _file_digest(path: str) -> str:
    """sha256 of the file's bytes (read once per process: an edit takes effect in a new one,
    as Numba's own reading of the sources does)."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "unreadable"


def dependency_digest(py_func) -> str:
    """One sha256 over the names and contents of :func:`dependency_files`."""
    h = hashlib.sha256()
    for path in dependency_files(py_func):
        h.update(f"{os.path.relpath(path, PACKAGE_DIR)}\0{_file_digest(path)}\0".encode())
    return h.hexdigest()


_digests: dict = {}
"""py_func -> :func:`dependency_digest` (computed once per process and function)."""


def _with_dependencies(index_key):
    def key(self, sig, codegen):
        fn = self._py_func
        digest = _digests.get(fn)
        if digest is None:
            digest = _digests[fn] = dependency_digest(fn)
        return (*index_key(self, sig, codegen), digest)
    key._miniflow_dependencies = True
    return key


def install(cache_class=caching.Cache) -> None:
    """Append :func:`dependency_digest` to the index key of every Numba cache of
    ``cache_class`` in this process (Numba's CPU ``numba.core.caching.Cache`` by default;
    ``kernels.cuda.common`` passes numba-cuda's copy of it); idempotent."""
    if not hasattr(cache_class._index_key, "_miniflow_dependencies"):
        cache_class._index_key = _with_dependencies(cache_class._index_key)
