"""miniflow under a hostile environment: no writable Numba cache folder, an unwritable
``NUMBA_CACHE_DIR``, ``NUMBA_DISABLE_JIT=1``, a bad ``MINIFLOW_BACKEND``, no numba-cuda.

"Unwritable" is made without root's help (root ignores file modes): a folder below a regular *file*
can be neither created nor written, so ``NUMBA_CACHE_DIR=<file>/x`` is unwritable, and a copy of the
package whose kernel folders' ``__pycache__`` are files has an unwritable source tree, as a read-only
site-packages has. Each subprocess compiles one small graph (about a second).
"""
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numba
import numpy as np
import pytest

import miniflow as mf
from miniflow.kernels.common import cache as kcache
from miniflow.runtime.backend import cuda_status

PACKAGE = Path(mf.__file__).resolve().parent

_SCRIPT = textwrap.dedent("""
    import numpy as np
    import miniflow as mf
    from miniflow import nn
    from miniflow.kernels.common.cache import CACHE
    from miniflow.kernels.cpu import fp16

    class Fn(nn.Graph):
        def build(self, x):
            return (x * 3.0 + 1.0).exp()

    y = Fn()(np.ones((2, 3), np.float32)).numpy()
    print(mf.__file__)
    print(float(y[0, 0]), fp16.JIT_CACHE, (CACHE.paths or {}).get("cpu"), CACHE.generated)
""")


def _run(args, tmp_path, **env):
    """Run ``python args`` in ``tmp_path`` (so the repository is not on ``sys.path`` unless
    ``PYTHONPATH`` says so), without the caller's ``MINIFLOW_BACKEND``."""
    full = {k: v for k, v in os.environ.items() if k not in ("MINIFLOW_BACKEND", "PYTHONPATH")}
    full.update(env)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full,
                          cwd=tmp_path, timeout=300)


def _package_copy(tmp_path, writable_tree: bool) -> Path:
    """A copy of the miniflow package under ``tmp_path/pkg``; its kernel folders' ``__pycache__``
    are regular files unless ``writable_tree`` (then neither Python nor Numba can write there)."""
    root = tmp_path / "pkg"
    shutil.copytree(PACKAGE, root / "miniflow", ignore=shutil.ignore_patterns("__pycache__"))
    if not writable_tree:
        for folder in ("common", "cpu", "cuda"):
            (root / "miniflow" / "kernels" / folder / "__pycache__").write_text("not a folder")
    return root


@pytest.mark.slow  # compiles kernels in fresh processes
def test_no_writable_cache_folder_kernels_run_uncached_with_one_notice(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    root = _package_copy(tmp_path, writable_tree=False)
    env = dict(PYTHONPATH=str(root), NUMBA_CACHE_DIR=str(blocker / "x"),
               XDG_CACHE_HOME=str(blocker / "y"))
    (tmp_path / "s.py").write_text(_SCRIPT)
    r = _run(["s.py"], tmp_path, **env)
    assert r.returncode == 0, r.stderr
    where, values = r.stdout.splitlines()
    assert where.startswith(str(root))
    assert float(values.split()[0]) == pytest.approx(np.exp(4.0), rel=1e-6)
    assert values.split()[1:] == ["False", "None", "None"]        # uncached, sources in memory
    assert "Traceback" not in r.stderr
    notice = [ln for ln in r.stderr.splitlines() if ln.startswith("miniflow:")]
    assert len(notice) == 1, r.stderr
    assert notice[0].startswith("miniflow: compiling kernels without Numba's disk cache, so every "
                                "run compiles them again: Numba finds no writable cache folder (")
    assert f"NUMBA_CACHE_DIR={blocker / 'x'}" in notice[0]
    assert str(root / "miniflow" / "kernels" / "cpu" / "__pycache__") in notice[0]
    assert notice[0].endswith("set NUMBA_CACHE_DIR to a writable folder to cache them")
    assert not list(root.rglob("*.nbi")) and not list(tmp_path.rglob("fused_*.py"))

    info = _run(["-m", "miniflow", "info"], tmp_path, **env)
    assert info.returncode == 0, info.stderr
    assert "Numba cache of the kernels: off (Numba finds no writable cache folder: " in info.stdout
    assert "kernels from the Numba cache: no (caching is off for these kernels)" in info.stdout


@pytest.mark.slow  # compiles kernels in fresh processes
def test_unwritable_numba_cache_dir_caches_where_numba_falls_back(tmp_path):
    """Numba passes over an unwritable NUMBA_CACHE_DIR and caches next to the sources; miniflow
    says so once, writes its generated sources to the user cache folder, and ``info`` reports the
    folder Numba really writes to."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    root = _package_copy(tmp_path, writable_tree=True)
    env = dict(PYTHONPATH=str(root), NUMBA_CACHE_DIR=str(blocker / "x"),
               XDG_CACHE_HOME=str(tmp_path / "xdg"))
    (tmp_path / "s.py").write_text(_SCRIPT)
    r = _run(["s.py"], tmp_path, **env)
    assert r.returncode == 0, r.stderr
    in_tree = root / "miniflow" / "kernels" / "cpu" / "__pycache__"
    folders = f"cpu: {in_tree}, cuda: {root / 'miniflow' / 'kernels' / 'cuda' / '__pycache__'}"
    generated = tmp_path / "xdg" / "miniflow" / "generated"
    assert r.stdout.split()[-3:] == ["True", str(in_tree), str(generated)]
    notice = [ln for ln in r.stderr.splitlines() if ln.startswith("miniflow:")]
    assert notice == [f"miniflow: compiling kernels (first run only; later runs load them from "
                      f"Numba's cache); NUMBA_CACHE_DIR={blocker / 'x'} is not writable, so Numba "
                      f"caches them in {folders}"], r.stderr
    assert list(generated.glob("fused_cpu_*.py"))       # the fused kernel, cached next to it
    assert list((generated / "__pycache__").glob("fused_cpu_*.nbi"))

    info = _run(["-m", "miniflow", "info"], tmp_path, **env)   # its probe kernel: relu
    assert info.returncode == 0, info.stderr
    assert (f"Numba cache of the kernels: {folders} (next to the sources; "
            f"NUMBA_CACHE_DIR={blocker / 'x'} is not writable)") in info.stdout
    assert "kernels from the Numba cache: no (compiled now and cached" in info.stdout
    assert list(in_tree.glob("elementwise.*.nbi"))           # where info said


def test_locate_follows_numbas_locators(tmp_path, monkeypatch):
    """:func:`locate` in process: NUMBA_CACHE_DIR when writable; no folder at all (Numba's own
    locators restricted to NUMBA_CACHE_DIR); an unwritable generated-sources folder."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "cache"))
    c = kcache.locate()
    assert c.enabled and list(c.paths) == ["cpu", "cuda"]
    assert all(c.paths[k].startswith(str(tmp_path / "cache" / f"{k}_")) for k in c.paths)
    assert c.generated == str(tmp_path / "cache" / "miniflow_generated")
    assert c.problem is None and c.describe() == (f"cpu: {c.paths['cpu']}, cuda: "
                                                  f"{c.paths['cuda']} (in NUMBA_CACHE_DIR)")

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(blocker / "x"))
    monkeypatch.setattr(numba.config, "CACHE_LOCATOR_CLASSES", "UserProvidedCacheLocator")
    c = kcache.locate()
    assert not c.enabled and c.generated is None
    assert c.describe().startswith("off (Numba finds no writable cache folder: cannot cache "
                                   "function '_probe': no locator available")

    monkeypatch.setattr(numba.config, "CACHE_LOCATOR_CLASSES", "")
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "y"))
    c = kcache.locate()
    assert not c.enabled
    assert c.problem == (f"the generated kernel sources cannot be written to "
                         f"{blocker / 'y' / 'miniflow' / 'generated'}: Not a directory")


def test_numba_disable_jit_is_refused_at_import_in_one_sentence(tmp_path):
    sentence = ("miniflow does not support NUMBA_DISABLE_JIT=1 (its kernels need Numba's compiler: "
                "float16 intrinsics and IEEE arithmetic); unset NUMBA_DISABLE_JIT to use miniflow")
    env = dict(PYTHONPATH=str(PACKAGE.parent), NUMBA_DISABLE_JIT="1")
    r = _run(["-c", "import miniflow"], tmp_path, **env)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == f"ImportError: {sentence}"
    assert len(r.stderr.splitlines()) <= 5, r.stderr      # the import line, not a traceback wall
    cli = _run(["-m", "miniflow", "info"], tmp_path, **env)
    assert cli.returncode == 1 and cli.stdout == ""
    assert cli.stderr.count("\n") == 1 and f"(ImportError: {sentence})" in cli.stderr


@pytest.mark.parametrize("value", ["0", "-1", "two", "\u00b2"])
def test_a_numba_num_threads_that_is_no_positive_number_is_refused_by_name(tmp_path, value):
    """Numba's own import error ("Number of threads specified must be > 0.") does not name the
    variable; miniflow's names it and its value, in one sentence, for ``import`` and the CLI."""
    sentence = (f"miniflow: NUMBA_NUM_THREADS={value!r} is not a positive whole number (the "
                f"threads miniflow's kernels run on): set it to 1 or more, or unset it to use "
                f"every core")
    env = dict(PYTHONPATH=str(PACKAGE.parent), NUMBA_NUM_THREADS=value)
    r = _run(["-c", "import miniflow"], tmp_path, **env)
    assert r.returncode == 1 and r.stderr.splitlines()[-1] == f"ImportError: {sentence}"
    cli = _run(["-m", "miniflow", "info"], tmp_path, **env)
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1 and sentence in cli.stderr


def test_info_names_the_isa_numba_compiles_for_under_numba_cpu_name(tmp_path):
    """``NUMBA_CPU_NAME=haswell`` on any x86 CPU: AVX2's 8 lanes, from the target itself (the
    feature string is empty when a CPU is named)."""
    if not miniflow_target_is_x86():
        pytest.skip("haswell is an x86 CPU name")
    r = _run(["-m", "miniflow", "info"], tmp_path, PYTHONPATH=str(PACKAGE.parent),
             NUMBA_CPU_NAME="haswell", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stderr
    [line] = [x for x in r.stdout.splitlines() if x.startswith("CPU: ")]
    assert "Numba compiles for haswell (NUMBA_CPU_NAME;" in line and "avx2, 8 float32" in line
    assert "features avx, fma, f16c" in line


def test_a_numba_cpu_name_llvm_does_not_know_is_refused_by_name(tmp_path):
    """``NUMBA_CPU_NAME=Haswell`` (the docs pair ``haswell`` with ``OPENBLAS_CORETYPE=Haswell``):
    LLVM knows no such CPU, and with the feature string miniflow empties for a named CPU it
    compiled for no CPU at all and aborted the process at the first kernel ("LLVM ERROR: 64-bit
    code requested ...", no traceback). Now an ImportError naming the variable, when the kernels
    are first imported (the first op), in a script and in the CLI."""
    sentence = ("miniflow: NUMBA_CPU_NAME='Haswell' is not a CPU name LLVM knows: write one of "
                "its names, in lower case")
    env = dict(PYTHONPATH=str(PACKAGE.parent), NUMBA_CPU_NAME="Haswell",
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    r = _run(["-c", "import miniflow, numpy; print(miniflow.tensor(numpy.ones(3)).exp())"],
             tmp_path, **env)
    assert r.returncode == 1 and r.stderr.splitlines()[-1].startswith(f"ImportError: {sentence}")
    assert "LLVM ERROR" not in r.stderr
    cli = _run(["-m", "miniflow", "info"], tmp_path, **env)
    assert cli.returncode == 1 and sentence in cli.stderr.splitlines()[-1]
    assert "LLVM ERROR" not in cli.stderr


def miniflow_target_is_x86() -> bool:
    import platform
    return platform.machine() in ("x86_64", "AMD64", "i686")


@pytest.mark.parametrize("env,backend_line,code", [
    ({"MINIFLOW_BACKEND": " CPU "}, "backend: cpu", 0),
    pytest.param({"MINIFLOW_BACKEND": "cuda"}, "backend: unavailable: miniflow: the cuda backend "
                 "was requested but no CUDA device was found", 1,
                 marks=pytest.mark.skipif(cuda_status()[0], reason="a CUDA device is present")),
])
def test_info_reports_a_bad_backend_without_a_traceback(env, backend_line, code, tmp_path):
    r = _run(["-m", "miniflow", "info"], tmp_path, PYTHONPATH=str(PACKAGE.parent), **env)
    assert r.returncode == code, r.stderr
    assert backend_line in r.stdout and "Traceback" not in r.stderr
    assert "Numba cache of the kernels: " in r.stdout and "float16 conversion" in r.stdout


@pytest.mark.parametrize("name, value, accepted", [
    ("MINIFLOW_BACKEND", "gpu", "one of cpu, cuda (any case)"),
    ("MINIFLOW_MATMUL", "bogus", "one of auto, numba, blas, packed, mkl"),
    ("MINIFLOW_CUBLAS", "off", "0 or 1"),
    ("MINIFLOW_FP16_FALLBACK", "yes", "0 or 1"),
    ("MINIFLOW_DIST_TIMEOUT", "ten", "a positive number of seconds")])
def test_a_bad_miniflow_variable_stops_any_program_with_one_line_and_exit_code_2(
        name, value, accepted, tmp_path):
    """``MINIFLOW_MATMUL=bogus python tutorials/01_lazy_graph.py`` ended in a traceback from the
    first matmul; ``MINIFLOW_BACKEND=bogus miniflow info`` exited 1, ``train`` 2; a bad
    ``MINIFLOW_CUBLAS`` or ``MINIFLOW_FP16_FALLBACK`` was taken silently. ``import miniflow``
    reads every variable: a bad value is one line naming it, its value and the accepted
    values, and exit code 2, for a script, a lesson and the command alike."""
    line = f"miniflow: {name}={value!r} is not {accepted}: "
    lesson = str(PACKAGE.parent / "tutorials" / "01_lazy_graph.py")
    for args in (["-c", "import miniflow; print('ran')"], [lesson], ["-m", "miniflow", "info"]):
        r = _run(args, tmp_path, PYTHONPATH=str(PACKAGE.parent), **{name: value})
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(line), (args, r.stderr)


def test_info_without_numba_cuda(tmp_path):
    """numba-cuda hidden from the import system: ``info`` says it is not installed, runs on cpu."""
    script = textwrap.dedent("""
        import importlib.metadata, sys

        sys.modules["numba_cuda"] = None      # find_spec: None, import: ImportError
        real = importlib.metadata.version
        def version(name):
            if name == "numba-cuda":
                raise importlib.metadata.PackageNotFoundError(name)
            return real(name)
        importlib.metadata.version = version
        from miniflow.cli import main
        raise SystemExit(main(["info"]))
    """)
    r = _run(["-c", script], tmp_path, PYTHONPATH=str(PACKAGE.parent))
    assert r.returncode == 0, r.stderr
    assert "numba-cuda not installed (pip install 'miniflow[cuda]')" in r.stdout
    assert "GPU: no GPU (numba-cuda is not installed)" in r.stdout and "backend: cpu" in r.stdout


def _save_many(folder, first, count, barrier):
    """Save ``count`` cache entries, keys ``first...``, each with data naming its key."""
    from numba.core.caching import IndexDataCacheFile
    from miniflow.kernels.common import cache_lock
    assert cache_lock.install()
    cache = IndexDataCacheFile(folder, "kernel", "stamp")
    barrier.wait()
    for k in range(first, first + count):
        cache.save(("key", k), ("data", k))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (fcntl locks are POSIX)")
def test_two_processes_saving_to_one_numba_cache_lose_and_mix_up_nothing(tmp_path):
    """Two processes each save 150 overloads of one function into one cache folder at the same
    moment (two pytest-xdist workers, or two MPI ranks, compiling on a cold cache): every key ends
    in the index, with its own data. Numba's own save (read the index, pick the first free data
    file, write both, no lock) loses most of them here and can give one key another's data
    (``miniflow.kernels.common.cache_lock``)."""
    import multiprocessing
    from numba.core.caching import IndexDataCacheFile
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), first, 150, barrier))
             for first in (0, 1000)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    cache = IndexDataCacheFile(str(tmp_path), "kernel", "stamp")
    keys = [("key", k) for first in (0, 1000) for k in range(first, first + 150)]
    assert sorted(cache._load_index()) == sorted(keys)
    assert all(cache.load(key) == ("data", key[1]) for key in keys)
    assert len(set(cache._load_index().values())) == len(keys)


_COMPILE_ONCE = textwrap.dedent("""
    import sys, time
    from numba import types
    from numba.core import event
    from miniflow.kernels.common import cache_lock
    from miniflow.kernels.common.cache import CACHE
    assert CACHE.enabled and cache_lock.install()
    import kern
    compiled = []

    class Count(event.Listener):
        def on_start(self, ev):
            compiled.append(ev.data["dispatcher"].py_func.__qualname__)

        def on_end(self, ev):
            pass

    event.register("numba:compile", Count())
    if sys.argv[1] == "holder":             # holds the key's lock as a compiling process does
        lock = cache_lock.CompileLock(kern.twice._cache, (types.float64,),
                                      kern.twice.targetctx.codegen())
        assert lock.acquire(wait_s=0)
        print("HELD", flush=True)
        sys.stdin.readline()
    else:
        print("READY", flush=True)
    t0 = time.perf_counter()
    assert kern.twice(1.5) == 3.0
    print("COMPILED", len(compiled), "WAITED", round(time.perf_counter() - t0, 2), flush=True)
    if sys.argv[1] == "holder":
        lock.release()
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fcntl record locks are POSIX")
def test_a_process_missing_the_cache_waits_for_another_compiling_the_same_kernel(tmp_path):
    """Compile once, then read (``cache_lock.CompileLock``): while one process compiles a kernel
    for a signature (here it holds that key's lock, then compiles), a second process that misses
    the cache for the same key waits, and then loads the first one's result instead of compiling
    it again. Numba alone compiles it in both (two pytest-xdist workers, two MPI ranks, the
    simulator lane's shards on a cold cache), which is CPU time spent twice."""
    (tmp_path / "kern.py").write_text("import numba\n\n\n@numba.njit(cache=True)\n"
                                      "def twice(x):\n    return 2 * x\n")
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(PACKAGE.parent)]))
    run = [sys.executable, "-c", _COMPILE_ONCE]
    holder = subprocess.Popen(run + ["holder"], env=env, cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "HELD", holder.stderr.read()
        waiter = subprocess.Popen(run + ["waiter"], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert waiter.stdout.readline().strip() == "READY", waiter.stderr.read()
        time.sleep(1.0)                     # the waiter is past its cache miss by now
        holder.stdin.write("go\n")
        holder.stdin.flush()
        first, second = (p.communicate(timeout=120) + (p.returncode,) for p in (holder, waiter))
        assert first[2] == 0 and second[2] == 0, first[1] + second[1]
        words = second[0].split()
        assert words[:2] == ["COMPILED", "0"], f"the second process compiled it too: {second[0]}"
        assert float(words[3]) >= 0.9, second[0]              # it waited for the first
        assert first[0].split()[:2] == ["COMPILED", "1"], first[0]
    finally:
        for p in (holder, locals().get("waiter")):
            if p is not None and p.poll() is None:
                p.kill()
