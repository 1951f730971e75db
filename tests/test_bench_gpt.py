"""Tests of the GPT rows of benchmarks/speed.py (``benchmarks/gpt_step.py``, ``jax_gpt.py``): the
JAX GPT's loss and AdamW against PyTorch's (skipped without jax and torch), every framework's
worker computes miniflow's step, a worker imports only its framework, and the first-loss check
notices a framework that computes something else."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpt_step  # noqa: E402
import harness  # noqa: E402
import speed  # noqa: E402


def _installed(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def test_jax_gpt_gives_torch_gpts_loss_and_adamw_its_trajectory():
    """jax_gpt.loss at nanoGPT's weights equals TorchGPT's loss (float32, 1e-5), and three
    jax_gpt.adamw updates from its gradients give torch.optim.AdamW's parameters."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    import jax_gpt
    from torch_gpt import TorchGPT

    cfg = dict(n_layer=2, n_head=2, n_embd=16)
    torch.manual_seed(0)
    ref = TorchGPT(23, 12, **cfg)
    rng = np.random.default_rng(0)
    idx, tgt = (rng.integers(0, 23, (3, 10)) for _ in range(2))
    p = jax_gpt.params_from_state_dict({k: v.detach().numpy() for k, v in
                                        ref.state_dict().items()})
    m = {k: np.zeros(v.shape, np.float32) for k, v in p.items()}
    v = dict(m)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    grad = jax.jit(jax.value_and_grad(lambda q, i, t: jax_gpt.loss(q, i, t, 2, 2)))
    for step in range(1, 4):
        opt.zero_grad()
        _, want = ref(torch.from_numpy(idx), torch.from_numpy(tgt))
        want.backward()
        opt.step()
        loss, g = grad(p, idx.astype(np.int32), tgt.astype(np.int32))
        assert abs(float(loss) - want.item()) <= 1e-5 * want.item()
        p, m, v = jax_gpt.adamw(p, g, m, v, np.float32(step), 1e-2, weight_decay=0.1)
    for k, t in ref.state_dict().items():
        got, want = np.array(p[k.replace("lm_head", "transformer.wte")]), t.detach().numpy()
        if k.endswith("c_attn.bias"):
            # the key bias adds one constant to every score of a softmax row: its gradient is
            # rounding noise (~1e-9), which Adam's normalisation turns into steps of about lr in
            # either framework; it is left out, as the losses above show it changes nothing
            got[16:32], want[16:32] = 0, 0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_gpt_workers_compute_miniflows_step(dtype):
    """Three steps in each worker process (miniflow, and JAX jit and PyTorch where installed):
    the losses agree with miniflow's (speed.CHECK_RTOL)."""
    frameworks = ["miniflow"] + [name for name, module in (("JAX jit", "jax"), ("PyTorch", "torch"))
                                 if _installed(module)]
    lines = gpt_step.check_gpt(dtype, 2, frameworks, harness.default_core(), 1, steps=3)
    assert len(lines) == len(frameworks)
    assert all(", " in line.split("losses ")[1] for line in lines)


def test_first_loss_check_names_the_framework_that_differs():
    speed.check_first_losses("gpt fp16 batch 2", "fp16", {"miniflow": 5.10, "JAX jit": 5.14})
    with pytest.raises(AssertionError, match="gpt fp32 batch 2: first loss of PyTorch is 5.2"):
        speed.check_first_losses("gpt fp32 batch 2", "fp32", {"miniflow": 5.1, "PyTorch": 5.2})


@pytest.mark.parametrize("framework, absent", [("JAX jit", ("torch", "miniflow", "numba")),
                                                ("PyTorch", ("jax", "miniflow", "numba"))])
def test_a_worker_imports_only_its_framework(framework, absent):
    """The pinning of a worker (harness.start_on_one_core with gpt_step.NEEDS) leaves the other
    frameworks unimported, so the worker's peak RSS is its framework's."""
    pytest.importorskip(gpt_step.NEEDS[framework][0])
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import harness, gpt_step; "
            f"harness.start_on_one_core(harness.default_core(), 1, gpt_step.NEEDS[{framework!r}]);"
            " print(json.dumps(sorted(m for m in sys.modules if '.' not in m)))")
    out = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True,
                         text=True, check=True).stdout
    loaded = set(json.loads(out.strip().splitlines()[-1]))
    assert gpt_step.NEEDS[framework][0] in loaded
    assert not loaded & set(absent), loaded & set(absent)
