"""Running a script under ``mpiexec -n N`` for the distributed tests (the ``dist`` extra).

The script does the MPI work and writes its results per rank (JSON, ``.npz``) into a folder the
test reads. :func:`launch` starts ``mpiexec`` in a session of its own so that :func:`finish` can
kill the whole job (launcher, proxies, ranks) when it overruns its timeout, failing the test
with the job's output instead of hanging CI.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import miniflow

SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"


def find_mpiexec() -> str | None:
    """The ``mpiexec`` installed next to this Python (the ``mpich`` wheel), else on PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def _skip_reason() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "the dist extra is not installed (no mpi4py): pip install -e '.[dist]'"
    if find_mpiexec() is None:
        return "the dist extra is not installed (no mpiexec): pip install -e '.[dist]'"
    return None


SKIP_REASON = _skip_reason()
requires_mpi = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def child_env(extra: dict | None = None) -> dict:
    """The environment of the ranks: this miniflow first on PYTHONPATH, one thread per pool."""
    env = dict(os.environ)
    root = str(Path(miniflow.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = "1"
    env.update(extra or {})
    return env


def launch(script: str, n: int, out: Path, *args, env: dict | None = None) -> subprocess.Popen:
    """Start ``mpiexec -n n python mpi_scripts/<script> out *args``."""
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, str(SCRIPTS / script), str(out),
           *map(str, args)]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(env),
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    """Wait for the job: ``(return code, stdout + stderr, seconds waited)``; a job still running
    after ``timeout`` seconds is killed (its whole session) and the test fails."""
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"mpiexec still running after {timeout} s (killed); output:\n{out}\n{err}")
    return proc.returncode, out + err, time.monotonic() - t0


def run_mpi(script: str, n: int, out: Path, *args, timeout: float = 120, env=None):
    """Run the job to its end: ``(return code, output, seconds)``."""
    return finish(launch(script, n, out, *args, env=env), timeout)


def run_cli(n: int, cwd: Path, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``mpiexec -n n python -m miniflow *args`` in ``cwd``, to its end (killed after
    ``timeout`` seconds, failing the test): its return code, stdout and stderr."""
    cmd = [find_mpiexec(), "-n", str(n), sys.executable, "-m", "miniflow", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def rank_results(out: Path, n: int) -> list[dict]:
    """The ``rank<r>.json`` every rank wrote."""
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def wait_for_files(paths, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until every path exists (fails the test if the job ends or the time runs out)."""
    deadline = time.monotonic() + timeout
    while not all(Path(p).exists() for p in paths):
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the job ended (rc {proc.returncode}) before writing {paths}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no {paths} after {timeout} s")
        time.sleep(0.05)


def kill_ranks(pids) -> None:
    """SIGKILL the ranks still running: hydra starts every rank in a session of its own, so
    killing the job's session misses ranks whose proxy has died."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def kill_a_rank(script: str, out: Path, *args, timeout: float = 60) -> tuple[int, str, float]:
    """Start ``script`` on 2 ranks (it writes ``out/pid<r>.json`` once running, then loops),
    SIGKILL rank 1 and wait for the job: ``(return code, output, seconds after the kill)``. Fails
    the test if rank 0 is still alive then; leftover ranks are killed in any case."""
    proc = launch(script, 2, out, *args)
    wait_for_files([out / "pid0.json", out / "pid1.json"], proc, timeout=120)
    pids = [json.loads((out / f"pid{r}.json").read_text())["pid"] for r in range(2)]
    try:
        os.kill(pids[1], signal.SIGKILL)
        rc, output, seconds = finish(proc, timeout=timeout)
        assert not alive(pids[0]), f"rank 0 outlived the job:\n{output}"
        return rc, output, seconds
    finally:
        kill_ranks(pids)
