"""One dependency direction: every import inside ``miniflow/`` goes down the layer table, never up.

The checker parses every module with ``ast`` (module-level AND function-level imports, relative
imports resolved) and reports each import of a higher layer, of the other layer-3 package
(``passes`` <-> ``kernels``) or of the other backend's kernels (``kernels.cpu`` <->
``kernels.cuda``), unless :data:`ALLOWLIST` names it. Inside ``kernels``, ``kernels.common`` is
below the backends (layer 3, the backend packages 3.5): shared code imports no backend. A second
test feeds it a synthetic back-import and checks that it is reported.

The compile package (``miniflow.compiler``: the driver, its configuration, the half weight copies)
is above ``nn``, ``optim`` and ``amp``: it may import every lower layer; below it only
``miniflow.nn`` reaches it, in one place: ``nn.__getattr__`` imports the package (not one of its
modules) to hand out ``nn.Graph`` / ``nn.GraphConfig``. ``nn`` holds layers only: it imports no
pass (the passes' state is the driver's business).

Also: no import circle anywhere (experiments included), the kernel-family table is explicit
(every backend imports, by name, one module per family of ``kernels.common.table.FAMILIES``, and
each family builds the same op types on every backend), and every function of ``miniflow/``
outside ``miniflow/kernels/`` is shorter than :data:`MAX_FUNCTION_LINES`.
"""
import ast
import importlib
from pathlib import Path

import miniflow
from miniflow.kernels.common.table import FAMILIES

PACKAGE = Path(miniflow.__file__).resolve().parent

LAYERS = {
    "miniflow.dtype": 0, "miniflow.random": 0, "miniflow.serialization": 0,
    "miniflow.distributed": 0, "miniflow.extras": 0, "miniflow.checkpoint": 0,
    "miniflow.checks": 0, "miniflow.environment": 0,
    "miniflow.ir": 1, "miniflow.ir_html": 1,
    "miniflow.ops": 2,
    "miniflow.passes": 3, "miniflow.kernels": 3,
    "miniflow.kernels.cpu": 3.5, "miniflow.kernels.cuda": 3.5,
    "miniflow.runtime": 4,
    "miniflow.tensor": 5, "miniflow.trace": 5,
    "miniflow.nn": 6, "miniflow.models": 6.5,
    "miniflow.optim": 7,
    "miniflow.amp": 8,
    "miniflow.compiler": 9,
    "miniflow.data": 10, "miniflow.experiments": 10, "miniflow.cli": 10, "miniflow.testing": 10,
    "miniflow.__main__": 10, "miniflow": 10, "miniflow.onnx": 10, "miniflow.logging": 10,
    "miniflow.exercises": 10,
}
"""Module (or package) -> layer; a module is in the layer of its longest listed prefix."""

BACKEND_PACKAGES = ("miniflow.kernels.cpu", "miniflow.kernels.cuda")
"""The kernel packages: each has one module per kernel family (``kernels.common.table.FAMILIES``)."""

APART = [("miniflow.passes", "miniflow.kernels"), ("miniflow.kernels.cpu", "miniflow.kernels.cuda")]
"""Pairs of the same layer that must not import each other (prefixes of the module name: the CPU
and CUDA kernels share only ``kernels.common``)."""

ALLOWLIST = {
    # nn.Graph is the compile driver (miniflow/compiler/, above nn, optim and amp); miniflow.nn
    # re-exports it as nn.Graph / nn.GraphConfig, imported on first use in nn.__getattr__
    # (test_only_nn_reaches_up_to_the_compile_package holds it to that one function).
    ("miniflow.nn", "miniflow.compiler"),
}
"""Back-imports that are allowed, each with its reason."""


def modules(root: Path = PACKAGE) -> dict:
    """Module name -> source of every ``.py`` file under ``root`` (``miniflow/nn/__init__.py`` is
    ``miniflow.nn``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("miniflow",) + path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path.read_text()
    return out


def imports(name: str, source: str, known: set) -> set:
    """The ``miniflow`` modules that module ``name`` imports, anywhere in its source.

    ``from X import y`` imports ``X.y`` when that is a module, else ``X``; relative imports are
    resolved against the module's package."""
    is_package = f"{name}.__init__" in known or any(k.startswith(name + ".") for k in known)
    package = name.split(".") if is_package else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m == "miniflow" or m.startswith("miniflow.")}


def layer(module: str) -> int:
    """The layer of ``module``: that of its longest prefix in :data:`LAYERS`."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in LAYERS:
            return LAYERS[".".join(parts[:k])]
    raise KeyError(f"{module} is in no layer: add it to LAYERS in tests/test_layering.py")


def _group(module: str, prefixes) -> str | None:
    return next((p for p in prefixes if module.startswith(p)), None)


def back_imports(sources: dict) -> list:
    """``"importer -> imported (reason)"`` for every import that breaks the layering and is not in
    :data:`ALLOWLIST`."""
    known = set(sources)
    bad = []
    for name, source in sorted(sources.items()):
        for target in sorted(imports(name, source, known)):
            if target == name or name.startswith(target + ".") or (name, target) in ALLOWLIST:
                continue                     # a package importing itself, a module its package
            if layer(target) > layer(name):
                bad.append(f"{name} -> {target} (layer {layer(name)} imports layer "
                           f"{layer(target)})")
            for pair in APART:
                a, b = _group(name, pair), _group(target, pair)
                if a and b and a != b:
                    bad.append(f"{name} -> {target} ({a} and {b} must not import each other)")
    return bad


def test_every_import_goes_down_the_layers():
    bad = back_imports(modules())
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_every_module_has_a_layer_and_every_allowlist_entry_is_used():
    sources = modules()
    for name in sources:
        layer(name)
    known = set(sources)
    used = {(name, t) for name, s in sources.items() for t in imports(name, s, known)}
    assert ALLOWLIST <= used, f"allowlist entries no module needs: {ALLOWLIST - used}"


def test_a_back_import_is_reported():
    sources = modules()
    sources["miniflow.ir"] += "\n\ndef _late():\n    from .ops import get_op\n    return get_op\n"
    sources["miniflow.kernels.cuda.elementwise"] += "\nfrom ..cpu.elementwise import map_steps\n"
    sources["miniflow.kernels.common.update"] += "\nfrom ..cpu.common import jitable\n"
    sources["miniflow.passes.autograd"] += "\nimport miniflow.kernels.cpu\n"
    sources["miniflow.optim.sgd"] += "\nfrom ..compiler.driver import Graph\n"
    bad = back_imports(sources)
    assert "miniflow.ir -> miniflow.ops (layer 1 imports layer 2)" in bad
    assert ("miniflow.kernels.cuda.elementwise -> miniflow.kernels.cpu.elementwise "
            "(miniflow.kernels.cuda and miniflow.kernels.cpu must not import each other)") in bad
    assert ("miniflow.kernels.common.update -> miniflow.kernels.cpu.common "
            "(layer 3 imports layer 3.5)") in bad
    assert ("miniflow.passes.autograd -> miniflow.kernels.cpu (miniflow.passes and "
            "miniflow.kernels must not import each other)") in bad
    assert "miniflow.passes.autograd -> miniflow.kernels.cpu (layer 3 imports layer 3.5)" in bad
    assert "miniflow.optim.sgd -> miniflow.compiler.driver (layer 7 imports layer 9)" in bad
    assert len(bad) == 6, bad


def test_distributed_imports_nothing_from_miniflow():
    """``miniflow.distributed`` is the lowest layer: the kernels, the compile driver and the data
    sampler all import it, and it imports none of them (nor anything else of miniflow but
    ``miniflow.environment``, which reads its ``MINIFLOW_DIST_TIMEOUT`` and imports nothing of
    miniflow)."""
    sources = modules()
    assert imports("miniflow.distributed", sources["miniflow.distributed"], set(sources)) == {
        "miniflow.environment"}
    assert imports("miniflow.environment", sources["miniflow.environment"], set(sources)) == set()


def import_cycles(sources: dict) -> list:
    """The import circles among ``sources``' modules (module-level and function-level imports;
    a module importing its own package is not an edge, as in :func:`back_imports`): each
    strongly connected component of more than one module, sorted (Tarjan's algorithm)."""
    known = set(sources)
    edges = {name: sorted(t for t in imports(name, s, known) if t in known and t != name
                          and not name.startswith(t + "."))
             for name, s in sources.items()}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circle_anywhere():
    cycles = import_cycles(modules())
    assert not cycles, f"import circles (modules importing each other): {cycles}"


def test_an_import_circle_is_reported():
    sources = modules()
    sources["miniflow.dtype"] += "\nfrom .random import manual_seed\n"
    sources["miniflow.random"] += "\nfrom .dtype import float32\n"
    assert ["miniflow.dtype", "miniflow.random"] in import_cycles(sources)


def test_every_backend_imports_every_kernel_family():
    """The family table is explicit: each backend's ``__init__`` imports its family modules by
    name (so the checks above see those imports), one per name in ``table.FAMILIES``."""
    sources = modules()
    known = set(sources)
    for package in BACKEND_PACKAGES:
        imported = imports(package, sources[package], known)
        missing = [f for f in FAMILIES if f"{package}.{f}" not in imported]
        assert not missing, f"{package}/__init__.py does not import the families {missing}"


def test_every_backend_provides_every_family_for_the_same_ops():
    """Every backend has every family, and each family builds the same op types everywhere (a
    kernel written for one backend only fails here, naming the family and the ops)."""
    packages = [importlib.import_module(p) for p in BACKEND_PACKAGES]
    for family in FAMILIES:
        ops = {p.__name__: set(importlib.import_module(f"{p.__name__}.{family}").BUILDERS)
               for p in packages}
        first = ops[BACKEND_PACKAGES[0]]
        assert first, family
        for name, got in ops.items():
            assert got == first, (f"family {family!r}: {name} builds {sorted(got ^ first)} "
                                  f"differently from {BACKEND_PACKAGES[0]}")
    assert all(set(p.KERNELS) == set(packages[0].KERNELS) for p in packages)


def test_every_backend_fills_every_family_record_through_its_protocol():
    """Every family with a step-maker protocol (``kernels.common.family.PROTOCOL_FAMILIES``):
    each backend's record (its ``BUILDERS``) has a builder for every op type of the family's
    ``OPS``, made by the family's ``builders`` (``family.record``) over a step maker of the one
    signature ``steps(ins, outs, plan, attrs)``, and the family's ``builders`` takes nothing but
    step makers by op type (what may come before them, conv's ``fill_steps``, is positional)."""
    import inspect

    from miniflow.kernels.common.family import PROTOCOL_FAMILIES
    for family in PROTOCOL_FAMILIES:
        common = importlib.import_module(f"miniflow.kernels.common.{family}")
        kinds = [p.kind for p in inspect.signature(common.builders).parameters.values()]
        assert kinds[-1] == inspect.Parameter.VAR_KEYWORD, family
        assert inspect.Parameter.KEYWORD_ONLY not in kinds, family
        for package in BACKEND_PACKAGES:
            record = importlib.import_module(f"{package}.{family}").BUILDERS
            missing = [op for op in common.OPS if op not in record]
            assert not missing, f"{package}.{family} has no step maker for {missing}"
            for op in common.OPS:
                build = record[op]
                assert getattr(build, "family", None) == family, (
                    f"{package}.{family}: {op!r} is not built by {family}.builders")
                params = inspect.signature(build.step_maker).parameters
                assert len(params) == 4, (package, op, list(params))


COMPILE = "miniflow.compiler"
"""The compile package; :func:`reaches_into_compile` lists who below it imports it."""


def reaches_into_compile(sources: dict) -> list:
    """``"importer: how"`` for every import of the compile package from a lower layer that is not
    the one allowed: ``miniflow.nn``'s ``__getattr__`` importing the package itself (lazily, so
    importing ``miniflow.nn`` does not load the driver)."""
    known, bad = set(sources), []
    for name, source in sorted(sources.items()):
        if layer(name) >= LAYERS[COMPILE]:
            continue
        tree = ast.parse(source)
        lazy = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                and f.name == "__getattr__" for n in ast.walk(f)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in imports(name, ast.unparse(node), known):
                if target != COMPILE and not target.startswith(COMPILE + "."):
                    continue
                if name == "miniflow.nn" and target == COMPILE and id(node) in lazy:
                    continue
                where = "in __getattr__" if id(node) in lazy else f"at line {node.lineno}"
                bad.append(f"{name}: imports {target} {where}")
    return bad


def test_only_nn_reaches_up_to_the_compile_package():
    sources = modules()
    assert reaches_into_compile(sources) == []
    imported = imports("miniflow.nn", sources["miniflow.nn"], set(sources))
    assert COMPILE in imported, "nn.Graph is no longer re-exported from miniflow.compiler"
    sources["miniflow.nn"] = "from ..compiler import Graph\n" + sources["miniflow.nn"]
    sources["miniflow.nn.module"] += "\n\ndef f():\n    from ..compiler.half_copies import x\n"
    bad = reaches_into_compile(sources)
    assert bad == ["miniflow.nn: imports miniflow.compiler at line 1",
                   "miniflow.nn.module: imports miniflow.compiler.half_copies at line "
                   f"{sources['miniflow.nn.module'].count(chr(10))}"], bad


def test_nn_holds_layers_only():
    """The compile driver's bookkeeping (pass states, half weight copies, plans) is in
    ``miniflow.compiler``: no module of ``miniflow.nn`` imports a pass or the plan builder."""
    sources = modules()
    known = set(sources)
    bad = [f"{name} -> {target}" for name, source in sorted(sources.items())
           if name == "miniflow.nn" or name.startswith("miniflow.nn.")
           for target in sorted(imports(name, source, known))
           if target.startswith(("miniflow.passes", "miniflow.runtime.plan"))]
    assert not bad, f"miniflow.nn imports the compile driver's business: {bad}"
    assert {"miniflow.compiler.config", "miniflow.compiler.driver",
            "miniflow.compiler.half_copies"} <= known


MAX_FUNCTION_LINES = 60
"""Every function outside ``miniflow/kernels/`` is shorter than this: its lines from ``def`` to
its last line, its docstring not counted (a kernel is one loop nest that Numba compiles as one
function; everything else splits into functions a reader takes in at once)."""


def long_functions(sources: dict, limit: int = MAX_FUNCTION_LINES) -> list:
    """``"module.function: N lines"`` for every function (methods and nested functions too) of
    ``sources`` outside ``miniflow.kernels`` with ``limit`` lines or more, longest first."""
    found = []
    for name, source in sources.items():
        if name.startswith("miniflow.kernels"):
            continue
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            if ast.get_docstring(node, clean=False) is not None:
                doc = node.body[0]
                lines -= doc.end_lineno - doc.lineno + 1
            if lines >= limit:
                found.append((lines, f"{name}.{node.name}: {lines} lines"))
    return [text for _, text in sorted(found, reverse=True)]


def test_every_function_outside_the_kernels_is_under_60_lines():
    bad = long_functions(modules())
    assert not bad, (f"functions of {MAX_FUNCTION_LINES} lines or more (split them):\n"
                     + "\n".join(bad))


def test_a_long_function_is_reported():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 2))
    sources = {"miniflow.long": f"def f():\n    \"\"\"Doc\n    string.\"\"\"\n{body}"
                                f"    return x0\n",
               "miniflow.kernels.cpu.long": f"def g():\n{body}{body}"}
    assert long_functions(sources) == [f"miniflow.long.f: {MAX_FUNCTION_LINES} lines"]
    sources["miniflow.long"] = sources["miniflow.long"].replace("    return x0\n", "")
    assert long_functions(sources) == []
