"""The kernels' Numba cache key covers the miniflow sources compiled into them from other files
(``miniflow.kernels.common.cache_key``): the scalar function a kernel closes over, its helpers,
jitted helpers of other modules and the overloads registered for them."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from numba import types

from miniflow.kernels.common import cache_key
from miniflow.kernels.common.cache import CACHE
from miniflow.kernels.cpu import fp16, special
from miniflow.kernels.cpu.elementwise import map_kernel, zip_kernel
from miniflow.ops import elementwise as ew

ROOT = Path(__file__).resolve().parent.parent


def test_a_kernel_depends_on_its_scalar_function_helpers_and_their_overloads():
    files = cache_key.dependency_files(zip_kernel(ew.gelu_grad, False).py_func)
    kernel_file = zip_kernel(ew.gelu_grad, False).py_func.__code__.co_filename
    assert files[0] == kernel_file
    for module in (ew, special, fp16):          # scalar function, its overloads, load / store
        assert module.__file__ in files
    assert all(f.startswith(cache_key.PACKAGE_DIR) for f in files), files


def test_the_index_key_changes_with_a_dependency_s_contents(monkeypatch):
    assert CACHE.enabled, "this test needs Numba's cache (NUMBA_CACHE_DIR writable)"
    kernel = map_kernel(ew.gelu, False)
    sig = (types.float32[::1], types.float32[::1])
    codegen = kernel.targetctx.codegen()
    before = kernel._cache._index_key(sig, codegen)
    assert before[-1] == cache_key.dependency_digest(kernel.py_func)
    digest = cache_key._file_digest
    monkeypatch.setattr(cache_key, "_file_digest",
                        lambda p: "edited" if p == special.__file__ else digest(p))
    monkeypatch.setattr(cache_key, "_digests", {})
    after = kernel._cache._index_key(sig, codegen)
    assert after[:-1] == before[:-1] and after[-1] != before[-1]
    other = map_kernel(ew.relu, False)              # calls no special function
    assert special.__file__ not in cache_key.dependency_files(other.py_func)


@pytest.mark.slow
def test_an_edited_helper_module_is_not_loaded_from_a_cache_written_before(tmp_path):
    """End to end: a cache written by a process that saw another ``special.py`` (here: its
    digest changed, as an edit changes it) misses, and the kernel is compiled again."""
    code = (
        "import sys\n"
        "from miniflow.kernels.common import cache_key\n"
        "from miniflow.kernels.cpu import special\n"
        "if sys.argv[1] == 'edited':\n"
        "    d = cache_key._file_digest\n"
        "    cache_key._file_digest = lambda p: 'edited' if p == special.__file__ else d(p)\n"
        "import numpy as np\n"
        "from miniflow.kernels.cpu.elementwise import map_kernel\n"
        "from miniflow.ops import elementwise as ew\n"
        "k = map_kernel(ew.gelu, False)\n"
        "k(np.zeros(4, np.float32), np.empty(4, np.float32))\n"
        "print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}

    def run(which):
        r = subprocess.run([sys.executable, "-c", code, which], env=env, capture_output=True,
                           text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        hits, misses = r.stdout.split()
        return int(hits), int(misses)

    assert run("edited") == (0, 1)
    assert run("edited") == (1, 0)          # the same sources: a hit
    assert run("current") == (0, 1)         # special.py differs: compiled again
