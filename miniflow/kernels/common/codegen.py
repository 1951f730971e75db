"""Kernel source generation: lowering a ``fused_elementwise`` expression to lines of kernel code,
and writing generated modules to files so that Numba's disk cache works for them.

Lowering (:func:`lower`) is shared by the CPU and CUDA kernels (``cpu.fused``, ``cuda.fused``); a
:class:`Dialect` says how each backend loads an input, rounds to float16 and stores an output.
Every function or cast result gets a local ``v<k>``, rounded to its dtype as the unfused kernel
rounds before a store (so fused and unfused graphs compute the same bits): f32 / f64 results are
``float32(...)`` / ``float64(...)`` of the value; f16 results are rounded to float16 and held in
float32 (``dialect.f16``), and a cast to f16 from f64 or i64 rounds once (``dialect.f16_wide``);
bf16 results the same with ``dialect.bf16`` and ``dialect.bf16_wide``.
Numbers become kernel arguments ``s<j>``, converted once to their function's compute type
(``c<j>``), so expressions that differ only in numbers share one kernel.

Files: Numba caches a compiled function under its source file (path and modification time) and its
bytecode; a function made by ``exec`` has no file and compiles again in every process. Generated
modules therefore live in real files, one per source text, named by its hash
(``<prefix>_<hash>.py``), written once (a temporary file renamed into place, so no process reads
half a file) and never rewritten, in :func:`generated_dir`: ``$NUMBA_CACHE_DIR/miniflow_generated``
when Numba caches in ``NUMBA_CACHE_DIR``, else ``miniflow/generated`` in the user's cache folder
(``$XDG_CACHE_HOME``, default ``~/.cache``); never in the source tree. Deleting it is always safe.
When Numba cannot cache (no writable folder, ``kernels.common.cache``), no file is written: the
module compiles from memory and its kernel with ``cache=False``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import sys
import tempfile
import types
from dataclasses import dataclass
from typing import Callable

from .cache import CACHE
from ...dtype import as_dtype
from ...ops.fused import CASTS, term_dtype
from ...ops.registry import scalar_functions

__all__ = ["Dialect", "Lowered", "FLAT", "lower", "functions", "function_imports", "module_source",
           "generated_dir", "load_source"]

FLAT = {"full": ("", "i"), "row": ("", "c"), "col": ("", "r"), "scalar": ("", "0")}
"""Where each broadcast kind (``ops.fused.broadcast_kinds``) is read: ``(suffix of the array's
name, index)``, for kernels indexing whole flat arrays by the element index ``i`` and, with two
dims, the row ``r`` and column ``c``. Outputs are written where ``"full"`` inputs are read."""


@dataclass(frozen=True)
class Dialect:
    """How one backend spells the non-arithmetic parts of a kernel.

    Attributes:
        load: ``(array, index, DType) -> code`` reading an input element as its compute value.
        store: format of writing an output element: fields ``array``, ``index``, ``value`` and
            ``dtype`` (the NumPy dtype name).
        f16: format rounding a float32 ``value`` to float16, held as float32.
        f16_wide: format rounding a float64 or int64 ``value`` to float16 once, held as float32.
        bf16, bf16_wide: the same for bfloat16.
        exact: format rounding ``value`` to ``dtype`` (``float32`` or ``float64``) so that the
            compiler cannot merge it with what reads it: the unfused graph stores every result,
            so a multiply whose product the next function adds to must not become one fused
            multiply-add (the CUDA dialect's ``round_float32``; on the CPU, Numba contracts
            nothing without fastmath, and the plain conversion is exact).
    """

    load: Callable
    store: str
    f16: str
    f16_wide: str
    bf16: str
    bf16_wide: str
    exact: str = "{dtype}({value})"


@dataclass
class Lowered:
    """A lowered program: ``params`` of the kernel (inputs ``x<k>``, numbers ``s<j>``, outputs
    ``out<k>``, then ``rows, cols`` or ``n``), its loop ``body`` (loads, one line per result, stores
    at ``i``), its ``numbers`` as ``(value, compute dtype name)`` in argument order, and the
    ``functions`` it calls (name -> function)."""

    params: list
    body: list
    numbers: list
    functions: list


def _rounded(dialect: Dialect, dtype, text: str, source=None) -> str:
    """Code rounding ``text`` (of DType ``source`` when it is a cast) to ``dtype``."""
    if dtype.name in ("float32", "float64"):
        return dialect.exact.format(dtype=dtype.name, value=text)
    narrow, wide = ((dialect.bf16, dialect.bf16_wide) if dtype.name == "bfloat16"
                    else (dialect.f16, dialect.f16_wide))
    if source is not None and source.name in ("float64", "int64"):
        return wide.format(value=text)
    return narrow.format(value=f"float32({text})")


def lower(program, input_dtypes, kinds, two_dims: bool, dialect: Dialect,
          places: dict = FLAT) -> Lowered:
    """Lower a parsed ``fused_elementwise`` program (``ops.fused.parse``) for inputs ``x<k>`` of
    ``input_dtypes`` broadcast as ``kinds`` (``ops.fused.broadcast_kinds``), read where ``places``
    says (:data:`FLAT`); the kernel loops over ``(rows, cols)`` when ``two_dims``, else over ``n``
    elements."""
    loads = []
    for k, (d, kind) in enumerate(zip(input_dtypes, kinds)):
        suffix, index = places[kind]
        loads.append(f"a{k} = " + dialect.load(f"x{k}{suffix}", index, d))
    out = Lowered([], loads, [], {})
    table = scalar_functions()
    named: dict = {}
    results = itertools.count()

    def value(term) -> str:
        if term[0] == "x":
            return f"a{term[1]}"
        if term[0] == "ref":
            return term[1]
        fn, args = term[1], term[2]
        dtype = term_dtype(term, input_dtypes, named)
        if fn in CASTS:
            source = term_dtype(args[0], input_dtypes, named)
            text = _rounded(dialect, dtype, value(args[0]), source)
        else:
            called = table[fn]
            out.functions[called.__name__] = called
            parts = [number(a[1], dtype) if a[0] == "num" else value(a) for a in args]
            text = _rounded(dialect, dtype, f"{called.__name__}({', '.join(parts)})")
        name = f"v{next(results)}"
        out.body.append(f"{name} = {text}")
        return name

    def number(v: float, dtype) -> str:
        out.numbers.append((v, "float64" if dtype.name == "float64" else "float32"))
        return f"c{len(out.numbers) - 1}"

    for name, term in program.statements:
        out.body.append(f"{name} = {value(term)}")
        named[name] = term_dtype(term, input_dtypes, named)
    suffix, index = places["full"]
    for k, y in enumerate(program.outputs):
        out.body.append(dialect.store.format(array=f"out{k}{suffix}", index=index, value=y,
                                             dtype=named[y].np.name))
    out.params = ([f"x{k}" for k in range(len(input_dtypes))]
                  + [f"s{j}" for j in range(len(out.numbers))]
                  + [f"out{k}" for k in range(len(program.outputs))]
                  + (["rows", "cols"] if two_dims else ["n"]))
    return out


def functions(lowered: Lowered) -> list:
    """The scalar functions ``lowered`` calls (ops' ``OpDef.scalar``), sorted by name."""
    return [lowered.functions[name] for name in sorted(lowered.functions)]


def function_imports(fns, alias: str = "") -> list:
    """Import lines of a generated module for the scalar functions ``fns``, from the modules that
    declare them (``from miniflow.ops.elementwise import add, relu``); each is bound to
    ``alias + name``."""
    by_module: dict = {}
    for fn in fns:
        by_module.setdefault(fn.__module__, []).append(fn.__name__)
    return [f"from {module} import "
            + ", ".join(n if not alias else f"{n} as {alias}{n}" for n in names)
            for module, names in sorted(by_module.items())]


def module_source(generator: str, lowered: Lowered, input_dtypes, kinds, imports: list,
                  decorator: str, loop: list) -> str:
    """A generated module: a docstring naming ``generator`` and the inputs, the ``imports`` (lines),
    and ``kernel(*lowered.params)`` under ``decorator``: the numbers converted to their compute
    type, then the ``loop`` header lines with ``lowered.body`` inside."""
    inputs = ", ".join(f"x{k}: {as_dtype(d).short} {kinds[k]}" for k, d in enumerate(input_dtypes))
    indent = "    " * (1 + sum(1 for ln in loop if ln.rstrip().endswith(":")))
    lines = [f'"""Generated by {generator} (a fused_elementwise kernel); do not edit.', "",
             f"inputs: {inputs}", '"""', *imports, "", "", decorator,
             f"def kernel({', '.join(lowered.params)}):",
             *(f"    c{j} = {ct}(s{j})" for j, (_, ct) in enumerate(lowered.numbers)),
             *("    " + ln for ln in loop), *(indent + ln for ln in lowered.body)]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- files
_MODULES: dict = {}


def generated_dir() -> str | None:
    """The folder generated sources are written to (``kernels.common.cache.CACHE.generated``);
    None when Numba cannot cache and they compile from memory."""
    return CACHE.generated


def _write_once(path: str, source: str) -> None:
    """Create ``path`` holding ``source`` unless it exists (atomic rename of a temporary file)."""
    if os.path.exists(path):
        return
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, path)


def load_source(prefix: str, source: str):
    """The module made from ``source``: imported from its file in :func:`generated_dir` (written
    there first if missing), or compiled from memory when there is no such folder; memoised per
    process."""
    name = f"{prefix}_{hashlib.sha1(source.encode()).hexdigest()[:20]}"
    if name not in _MODULES:
        folder, module_name = generated_dir(), f"_miniflow_generated_{name}"
        if folder is None:
            module = types.ModuleType(module_name)
            sys.modules[module_name] = module
            exec(compile(source, f"<generated {name}>", "exec"), module.__dict__)
        else:
            path = os.path.join(folder, name + ".py")
            _write_once(path, source)
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        _MODULES[name] = module
    return _MODULES[name]
