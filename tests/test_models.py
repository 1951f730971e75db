"""``miniflow.models``: the ResNets have torchvision's structure (parameter counts, state dict keys
and shapes), and the state dict of a torchvision-identical PyTorch ResNet
(``benchmarks/torch_resnet.py``: torchvision itself is not needed) loads into them and gives the
same eval outputs to 1e-4 in float32 (skipped without torch); the small-input stem and the digits
LeNet have the shapes they promise."""
import sys
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.experiments.mlp import EvalGraph as Eval
from miniflow.models import lenet, resnet18, resnet34, resnet50

try:
    import torch
    from torch import nn as tnn
except ImportError:   # torch is optional: its comparisons skip
    torch = tnn = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
if torch is not None:   # the torchvision-identical PyTorch ResNet (benchmarks/torch_resnet.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from torch_resnet import torch_resnet



@pytest.mark.parametrize("make,params,keys", [(resnet18, 11_689_512, 122),
                                              (resnet34, 21_797_672, 218),
                                              (resnet50, 25_557_032, 320)])
def test_resnets_have_torchvisions_parameter_counts_and_keys(make, params, keys):
    """torchvision's counts: resnet18 11,689,512 parameters, resnet34 21,797,672, resnet50
    25,557,032; their state dicts have 122, 218 and 320 entries."""
    mf.manual_seed(0)
    m = make()
    assert sum(int(np.prod(p.shape)) for p in m.parameters()) == params
    sd = m.state_dict()
    assert len(sd) == keys
    assert list(sd)[:6] == ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                            "bn1.running_var", "bn1.num_batches_tracked"]
    assert list(sd)[-2:] == ["fc.weight", "fc.bias"]
    assert "layer2.0.downsample.0.weight" in sd and "layer2.0.downsample.1.running_var" in sd


def test_small_input_stem_and_lenet_shapes():
    mf.manual_seed(0)
    m = resnet18(num_classes=10, in_channels=1, small_input=True)
    assert m.conv1.weight.shape == (64, 1, 3, 3) and isinstance(m.maxpool, nn.Identity)
    assert set(m.state_dict()) == set(resnet18(10, in_channels=1).state_dict())
    x = np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)
    m.eval()
    assert Eval(m)(x).shape == (2, 10)
    net = lenet()
    assert sum(int(np.prod(p.shape)) for p in net.parameters()) == 13_754
    assert Eval(net)(x).shape == (2, 10)
    with pytest.raises(ValueError, match="layers must be 4 positive block counts"):
        mf.models.ResNet(mf.models.BasicBlock, [2, 2, 2])


# ----------------------------------------------------------------------------- PyTorch
def _randomize_statistics(model, seed):
    """Non-trivial running statistics and affine parameters, as after training."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, tnn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.normal_(0, 0.1, generator=g)
                m.num_batches_tracked.fill_(3)


@needs_torch
@pytest.mark.parametrize("name,block,layers,make,size,kw", [
    ("resnet18", "basic", [2, 2, 2, 2], resnet18, 64, {}),
    ("resnet18-small", "basic", [2, 2, 2, 2], resnet18, 8, {"in_channels": 1,
                                                           "small_input": True}),
    ("resnet50", "bottleneck", [3, 4, 6, 3], resnet50, 64, {}),
])
def test_a_torchvision_state_dict_loads_and_gives_the_same_eval_outputs(name, block, layers,
                                                                        make, size, kw):
    torch.manual_seed(0)
    ref = torch_resnet(block, layers, num_classes=10, **kw)
    _randomize_statistics(ref, 1)
    ref.eval()
    mf.manual_seed(0)
    m = make(num_classes=10, **kw)
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    assert list(sd) == list(m.state_dict())
    assert all(sd[k].shape == v.shape and sd[k].dtype == v.dtype
               for k, v in m.state_dict().items())
    m.load_state_dict(sd)
    m.eval()
    x = np.random.default_rng(2).standard_normal((2, kw.get("in_channels", 3), size, size))
    x = x.astype(np.float32)
    got = Eval(m)(x).numpy()
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_gpt_loads_a_nanogpt_state_dict_with_its_causal_mask_buffers():
    """nanoGPT registers ``attn.bias`` (the causal mask, ``tril(ones(T, T))`` as ``[1, 1, T,
    T]``, a persistent buffer) where PyTorch has no flash attention (torch < 2.0), so its
    checkpoints hold one per block; a strict load listed them as unexpected keys. The mask is
    dropped as nanoGPT's own ``from_pretrained`` drops it (the model masks with op tril);
    an ``attn.bias`` that is not that mask is still refused, and the returned keys name it."""
    from miniflow.models import gpt
    model = gpt(11, block_size=8, n_layer=2, n_head=2, n_embd=8)
    sd = {k: v + 1 for k, v in model.state_dict().items()}
    mask = np.tril(np.ones((8, 8), np.float32)).reshape(1, 1, 8, 8)
    masked = {**sd, **{f"transformer.h.{i}.attn.bias": mask for i in range(2)}}
    assert model.load_state_dict(masked) == ([], [])
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, sd[k], err_msg=k)
    for bad in (np.ones((1, 1, 8, 8), np.float32), mask[0, 0], 2 * mask):
        with pytest.raises(RuntimeError, match=r"unexpected keys "
                                               r"\['transformer.h.0.attn.bias'\]"):
            model.load_state_dict({**sd, "transformer.h.0.attn.bias": bad})
    assert model.load_state_dict({**sd, "transformer.h.0.attn.bias": bad},
                                 strict=False) == ([], ["transformer.h.0.attn.bias"])


def test_the_gpts_tie_check_takes_nans_and_leaves_wrong_shapes_to_the_shape_error():
    """``models.gpt`` refuses a state dict whose tied ``lm_head.weight`` and
    ``transformer.wte.weight`` differ, but the same bits are the same matrix: a diverged model's
    NaN loads (it was refused as "differ"); a wrong shape under a tied name is the shape error
    naming both shapes (it was the tie check's ValueError)."""
    from miniflow.models import gpt
    from miniflow.nn.module import StateDictShapeError
    model = gpt(11, block_size=8, n_layer=1, n_head=2, n_embd=8)
    sd = {k: v.copy() for k, v in model.state_dict().items()}
    sd["transformer.wte.weight"][2, 3] = np.nan
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    model.load_state_dict(sd)
    assert np.isnan(model.transformer.wte.weight.numpy()[2, 3])
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="lm_head.weight and transformer.wte.weight differ"):
        model.load_state_dict(sd)
    sd["lm_head.weight"] = np.zeros((5, 8), np.float32)
    with pytest.raises(StateDictShapeError, match=r"'lm_head.weight' is f32\[11, 8\] in the "
                                                  r"model but float32\[5, 8\]"):
        model.load_state_dict(sd, strict=False)


@pytest.mark.parametrize("bias", ["no", 0, None])
def test_the_gpts_bias_flag_is_true_or_false(bias):
    """``bias='no'`` (any truthy value) built a GPT with biases; the flag is checked as
    nanoGPT's ``GPTConfig.bias: bool``."""
    with pytest.raises(TypeError, match=rf"gpt: bias must be True or False, got {bias!r}"):
        mf.models.gpt(11, 8, n_layer=1, n_head=2, n_embd=8, bias=bias)
    assert mf.models.gpt(11, 8, n_layer=1, n_head=2, n_embd=8, bias=np.False_).state_dict()
