"""The GPT rows of ``speed.py`` (``--models gpt``): the training step and peak memory of the GPT
of ``miniflow.models.gpt`` against JAX jit, torch.compile and PyTorch eager on the same model,
fp32, AMP fp16 and AMP bf16, on ``--threads`` threads (issue 25, item 5).

The case: 2 layers, 4 heads, 128 wide, context 64 (``CONFIG``, ``BLOCK``), the vocabulary of
``miniflow.data.stdlib_text`` (164 characters), one batch of ``--gpt-batch`` (default 16) windows
of its training split, AdamW (lr 1e-3, weight decay 0.1, PyTorch's betas and eps), mean
cross-entropy. Every framework starts from the same weights: miniflow's GPT initialisation
(nanoGPT's: N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer)), seed 0), written
with the batch to a temporary ``.npz`` by the parent and loaded by each framework. The steps:

* miniflow: ``TrainGPT`` (``miniflow train --model gpt``'s graph) with ``optim.AdamW``.
* JAX jit: one ``jax.jit`` function of ``jax.value_and_grad`` of the loss (``jax_gpt.py``: the
  same model as functions) and PyTorch's AdamW written out, parameters and optimizer state
  donated; each call waited for.
* torch.compile: ``torch_gpt.TorchGPT`` under ``torch.compile`` (the forward, its backward by
  AOTAutograd) and ``torch.optim.AdamW``'s ``step`` under ``torch.compile``, PyTorch's recipe.
* PyTorch eager: ``TorchGPT`` and ``torch.optim.AdamW`` (its default for-loop update on the CPU).

AMP, as in ``speed.py``: ``fp16`` is miniflow's ``enable_amp()`` with a dynamic ``GradScaler``;
JAX's matmul inputs cast to float16 (``jax_gpt.py``) with the same dynamic loss scale written out
(``speed.next_scale``); PyTorch's and torch.compile's ``torch.autocast("cpu", torch.float16)``
with ``torch.amp.GradScaler("cpu")`` (defaults: miniflow's). ``bf16``: the same in bfloat16,
without loss scaling.

Memory: every framework runs in a process of its own (a worker: this file run with
``--worker``), which imports only that framework and NumPy, so its peak resident set
(``VmHWM``: imports, compilation, model, optimizer and the step's buffers) is that
framework's cost; the worker reports it too just after its imports. The parent drives the
workers over pipes in ``speed.interleave``'s alternating rounds (one untimed step, then N timed
ones; the idle workers wait on their pipe), each round timed inside its worker by the worker's
CPU time and wall time. Every worker is pinned to the same cores (``--core``, ``--threads``),
every pool on ``--threads`` threads (``harness.start_on_one_core``). Before timing, every
framework's first loss is checked against miniflow's (``speed.check_first_losses``);
``speed.py --check --models gpt`` compares ``--check-steps`` losses.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import harness  # noqa: E402
import speed  # noqa: E402

CONFIG = dict(n_layer=2, n_head=4, n_embd=128)
BLOCK = 64
LR, WEIGHT_DECAY = 1e-3, 0.1
FRAMEWORKS = ("miniflow", "JAX jit", "torch.compile", "PyTorch")
NEEDS = {"miniflow": ("miniflow",), "JAX jit": ("jax",), "torch.compile": ("torch",),
         "PyTorch": ("torch",)}
"""The frameworks a worker imports (and pins) for each column."""
PREFIX = "@gpt_step "
"""Marks the worker's answers on its stdout (a library may print there too)."""


# ----------------------------------------------------------------------------- the case
def write_case(path, batch: int, seed: int = 0) -> Path:
    """Write the case to ``path`` (``.npz``): ``x``, ``y`` ``[batch, BLOCK]`` int64 (windows of
    ``stdlib_text``'s training split and their next characters), ``vocab`` and the weights of
    ``miniflow.models.gpt`` initialised from ``seed`` (keys ``w:<state dict name>``)."""
    import miniflow as mf
    from miniflow.data import stdlib_text

    corpus = stdlib_text()
    x, y = corpus.batch("train", batch, BLOCK, np.random.default_rng(seed))
    mf.random.manual_seed(seed)
    state = mf.models.gpt(corpus.vocab_size, BLOCK, **CONFIG).state_dict()
    np.savez(path, x=x, y=y, vocab=corpus.vocab_size, **{f"w:{k}": v for k, v in state.items()})
    return Path(path)


def read_case(path) -> tuple:
    """``(state dict, x, y, vocab)`` from :func:`write_case`'s file."""
    with np.load(path) as f:
        state = {k[2:]: f[k] for k in f.files if k.startswith("w:")}
        return state, f["x"], f["y"], int(f["vocab"])


# ----------------------------------------------------------------------------- the steps
def miniflow_step(state, x, y, vocab: int, dtype: str):
    """miniflow's step (``TrainGPT``, AdamW; AMP by ``speed.amp_graph``): ``step() -> loss``;
    ``step.graph`` is the graph."""
    import miniflow as mf
    from miniflow.experiments.train_gpt import TrainGPT

    model = mf.models.gpt(vocab, BLOCK, **CONFIG)
    model.load_state_dict(state)
    graph = speed.amp_graph(TrainGPT(model, mf.optim.AdamW(model.parameters(), lr=LR,
                                                           weight_decay=WEIGHT_DECAY)), dtype)
    tx, ty = mf.tensor(x), mf.tensor(y)

    def step():
        return float(graph(tx, ty))

    step.graph = graph
    return step


def torch_step(state, x, y, vocab: int, dtype: str, compiled: bool = False):
    """PyTorch's step (``TorchGPT``, ``torch.optim.AdamW``, autocast and, for fp16,
    ``GradScaler``); ``compiled``: the model and the optimizer's ``step`` under
    ``torch.compile``."""
    import torch
    from torch_gpt import TorchGPT

    model = TorchGPT(vocab, BLOCK, **CONFIG)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    forward = model
    if compiled:
        forward = torch.compile(model)
        opt.step = torch.compile(opt.step)
    scaler = torch.amp.GradScaler("cpu") if dtype == "fp16" else None
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        with speed._autocast(torch, dtype):
            _, loss = forward(tx, ty)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return float(loss.detach())

    return step


def jax_step(state, x, y, vocab: int, dtype: str):
    """The step as one ``jax.jit`` function: loss and gradients (``jax_gpt.loss``), for fp16 the
    dynamic loss scale (a step with a non-finite gradient changes nothing but the scale), and
    ``jax_gpt.adamw``; parameters and state donated."""
    import jax
    import jax.numpy as jnp
    import jax_gpt

    act = {"fp32": jnp.float32, "fp16": jnp.float16, "bf16": jnp.bfloat16}[dtype]
    scaled = dtype == "fp16"
    params = jax_gpt.params_from_state_dict(state)
    m, v = ({k: jnp.zeros_like(a) for k, a in params.items()} for _ in range(2))
    opt_state = (m, v, jnp.float32(0), jnp.float32(speed.SCALER["init_scale"]), jnp.int32(0))
    jx, jy = jnp.asarray(x.astype(np.int32)), jnp.asarray(y.astype(np.int32))

    def scaled_loss(p, scale):
        loss = jax_gpt.loss(p, jx, jy, CONFIG["n_layer"], CONFIG["n_head"], act)
        return loss * scale, loss

    def train_step(p, st):
        m, v, t, scale, tracker = st
        (_, loss), g = jax.value_and_grad(scaled_loss, has_aux=True)(
            p, scale if scaled else jnp.float32(1))
        finite = jnp.bool_(True)
        if scaled:
            g = {k: a * (1 / scale) for k, a in g.items()}
            finite = jnp.all(jnp.stack([jnp.isfinite(a).all() for a in g.values()]))
            scale, tracker = speed.next_scale(jnp, finite, scale, tracker)
        t = jnp.where(finite, t + 1, t)
        new = jax_gpt.adamw(p, g, m, v, t, LR, weight_decay=WEIGHT_DECAY)
        p, m, v = ({k: jnp.where(finite, a[k], b[k]) for k in a} for a, b in zip(new, (p, m, v)))
        return p, (m, v, t, scale, tracker), loss

    jstep = jax.jit(train_step, donate_argnums=(0, 1))
    box = [params, opt_state]

    def step():
        box[0], box[1], loss = jstep(box[0], box[1])
        return float(loss.block_until_ready())

    return step


BUILDERS = {"miniflow": miniflow_step, "JAX jit": jax_step, "PyTorch": torch_step,
            "torch.compile": lambda *a: torch_step(*a, compiled=True)}


# ----------------------------------------------------------------------------- the worker
def worker(framework: str, dtype: str, core: int, threads: int, case: str) -> None:
    """The worker's loop: pin, import ``framework`` only, build its step, answer the first loss;
    then one JSON answer per command line on stdin: ``steps K`` (K steps: their losses and CPU
    seconds per step), ``round N`` (one untimed step, N timed: ``harness.cpu_round``), ``quit``
    (peak RSS)."""
    pools, _ = harness.start_on_one_core(core, threads, NEEDS[framework])
    rss_imports = _peak_rss_mib()
    step = BUILDERS[framework](*read_case(case), dtype)
    _answer({"first_loss": step(), "pools": pools, "rss_imports_mib": rss_imports})
    for line in sys.stdin:
        cmd, *arg = line.split()
        if cmd == "steps":
            c0 = resource.getrusage(resource.RUSAGE_SELF)
            losses = [step() for _ in range(int(arg[0]))]
            c1 = resource.getrusage(resource.RUSAGE_SELF)
            _answer({"losses": losses, "cpu_s": (c1.ru_utime + c1.ru_stime - c0.ru_utime
                                                 - c0.ru_stime) / max(1, len(losses))})
        elif cmd == "round":
            step()
            _answer({"sample": harness.cpu_round(step, int(arg[0]))})
        elif cmd == "quit":
            _answer({"peak_rss_mib": _peak_rss_mib()})
            return
        else:
            raise ValueError(f"gpt_step worker: unknown command {line!r}")


def _peak_rss_mib() -> float:
    """This process's peak resident set so far, MiB: Linux's ``VmHWM`` (``/proc/self/status``),
    the high-water mark of this program's memory; elsewhere ``ru_maxrss`` (which Linux carries
    over ``execve`` from the process that started this one: the parent's peak, not ours)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024           # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** (
        2 if sys.platform == "darwin" else 1)


def _answer(obj: dict) -> None:
    print(PREFIX + json.dumps(obj), flush=True)


class Worker:
    """A worker process for one framework and dtype (``python gpt_step.py --worker ...``)."""

    def __init__(self, framework: str, dtype: str, core: int, threads: int, case: Path):
        self.name = framework
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", framework, dtype, "--core", str(core),
             "--threads", str(threads), "--case", str(case)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.started = self._read()

    def ask(self, command: str) -> dict:
        """Send ``command``, return the worker's answer."""
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):])
        raise RuntimeError(f"gpt_step: the {self.name} worker ended with status "
                           f"{self.proc.wait()} (its error is printed above)")

    def close(self) -> float:
        """Stop the worker; returns its peak RSS in MiB."""
        rss = self.ask("quit")["peak_rss_mib"]
        self.proc.wait()
        return rss


def start_workers(dtype: str, frameworks, core: int, threads: int, case: Path) -> dict:
    """``{framework: Worker}``, started one after another (each compiles alone)."""
    workers = {}
    try:
        for name in FRAMEWORKS:
            if name in frameworks:
                workers[name] = Worker(name, dtype, core, threads, case)
    except BaseException:
        for w in workers.values():
            w.proc.kill()
        raise
    return workers


# ----------------------------------------------------------------------------- parent side
def time_gpt(dtype: str, batch: int, frameworks, core: int, threads: int, runs: int,
             rounds: int, warmup: int = 2) -> dict:
    """One dtype's row: ``speed.interleave``'s medians per framework (the workers' CPU and wall
    times), first losses, and ``rss_mib`` / ``rss_imports_mib`` (peak RSS, and after the
    imports, per framework)."""
    with tempfile.TemporaryDirectory() as tmp:
        case = write_case(Path(tmp) / "gpt_case.npz", batch)
        workers = start_workers(dtype, frameworks, core, threads, case)
        losses = {name: w.started["first_loss"] for name, w in workers.items()}
        speed.check_first_losses(f"gpt {dtype} batch {batch}", dtype, losses)
        slowest = max(w.ask(f"steps {warmup}")["cpu_s"] for w in workers.values())
        timed = speed.interleave(
            {name: (lambda n, w=w: tuple(w.ask(f"round {n}")["sample"]))
             for name, w in workers.items()}, speed.steps_per_round(slowest), runs, rounds)
        imports = {name: w.started["rss_imports_mib"] for name, w in workers.items()}
        pools = {name: w.started["pools"] for name, w in workers.items()}
        rss = {name: w.close() for name, w in workers.items()}
    return {"model": "gpt", "dtype": dtype, "batch": batch, "threads": threads,
            "losses": losses, "rss_mib": rss, "rss_imports_mib": imports, "pools": pools, **timed}


def check_gpt(dtype: str, batch: int, frameworks, core: int, threads: int, steps: int) -> list:
    """Run ``steps`` steps in every framework's worker; raise AssertionError unless each step's
    loss agrees with miniflow's (``speed.CHECK_RTOL``). Returns the printed lines."""
    with tempfile.TemporaryDirectory() as tmp:
        case = write_case(Path(tmp) / "gpt_case.npz", batch)
        workers = start_workers(dtype, frameworks, core, threads, case)
        got = {name: [w.started["first_loss"]] + w.ask(f"steps {steps - 1}")["losses"]
               for name, w in workers.items()}
        for w in workers.values():
            w.close()
    return speed.check_losses(f"gpt {speed.LABEL[dtype]} batch {batch}", dtype, got)


def profile_step(dtype: str, batch: int, steps: int) -> dict:
    """``speed.profile_step`` of miniflow's GPT step, in this process."""
    with tempfile.TemporaryDirectory() as tmp:
        case = read_case(write_case(Path(tmp) / "gpt_case.npz", batch))
    return speed.profile_step(miniflow_step(*case, dtype), steps)


def table(rows: list) -> str:
    """The Markdown table of the GPT rows: CPU time per step in ms (wall time in parentheses),
    the other frameworks' over miniflow's (above 1: miniflow faster), peak RSS in MiB (after the
    imports in parentheses) and miniflow's over PyTorch eager's."""
    names = [n for n in FRAMEWORKS if any(n in r["cpu_step_s"] for r in rows)]
    others = names[1:]
    head = (["threads", "dtype"] + [f"{n} ms" for n in names] + [f"{n} / miniflow" for n in others]
            + [f"{n} peak RSS MiB" for n in names] + ["RSS miniflow / PyTorch"])
    out = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for r in rows:
        c, w, m = r["cpu_step_s"], r["step_s"], r["rss_mib"]
        cells = [str(r["threads"]), speed.LABEL[r["dtype"]]]
        cells += [f"{1e3 * c[n]:.1f} ({1e3 * w[n]:.1f})" if n in c else "-" for n in names]
        cells += [f"{c[n] / c['miniflow']:.2f} ({w[n] / w['miniflow']:.2f})" if n in c else "-"
                  for n in others]
        cells += [f"{m[n]:.0f} ({r['rss_imports_mib'][n]:.0f})" if n in m else "-"
                  for n in names]
        cells.append(f"{m['miniflow'] / m['PyTorch']:.2f}" if "PyTorch" in m else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> None:
    """The worker's entry (the parent is ``speed.py --models gpt``)."""
    p = argparse.ArgumentParser(description="a GPT benchmark worker (run by speed.py)")
    p.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "DTYPE"), required=True)
    p.add_argument("--core", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--case", required=True)
    args = p.parse_args(argv)
    worker(*args.worker, args.core, args.threads, args.case)


if __name__ == "__main__":
    main()
