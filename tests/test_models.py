"""``miniflow.models``: the ResNets have torchvision's structure (parameter counts, state dict keys
and shapes), and a torchvision-identical PyTorch ResNet (written here: torchvision itself is not
needed) loads into them and gives the same eval outputs to 1e-4 in float32 (skipped without
torch); the small-input stem and the digits LeNet have the shapes they promise."""
import numpy as np
import pytest

import miniflow as mf
from miniflow import nn
from miniflow.models import lenet, resnet18, resnet34, resnet50

try:
    import torch
    from torch import nn as tnn
except ImportError:   # torch is optional: its comparisons skip
    torch = tnn = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


class Eval(nn.Graph):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def build(self, x):
        return self.model(x)


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
def _torch_resnet(block, layers, num_classes=1000, in_channels=3, small_input=False):
    """A ResNet written exactly as torchvision's ``torchvision/models/resnet.py`` (v1.5): same
    modules, names and forward."""
    def conv3x3(i, o, stride=1):
        return tnn.Conv2d(i, o, 3, stride, 1, bias=False)

    def conv1x1(i, o, stride=1):
        return tnn.Conv2d(i, o, 1, stride, bias=False)

    class BasicBlock(tnn.Module):
        expansion = 1

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv3x3(inplanes, planes, stride)
            self.bn1 = tnn.BatchNorm2d(planes)
            self.relu = tnn.ReLU(inplace=True)
            self.conv2 = conv3x3(planes, planes)
            self.bn2 = tnn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Bottleneck(tnn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = conv1x1(inplanes, planes)
            self.bn1 = tnn.BatchNorm2d(planes)
            self.conv2 = conv3x3(planes, planes, stride)
            self.bn2 = tnn.BatchNorm2d(planes)
            self.conv3 = conv1x1(planes, planes * 4)
            self.bn3 = tnn.BatchNorm2d(planes * 4)
            self.relu = tnn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn3(self.conv3(self.relu(self.bn2(self.conv2(out)))))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    blocks = {"basic": BasicBlock, "bottleneck": Bottleneck}[block]

    class ResNet(tnn.Module):
        def __init__(self):
            super().__init__()
            self.inplanes = 64
            self.conv1 = (tnn.Conv2d(in_channels, 64, 3, 1, 1, bias=False) if small_input
                          else tnn.Conv2d(in_channels, 64, 7, 2, 3, bias=False))
            self.bn1 = tnn.BatchNorm2d(64)
            self.relu = tnn.ReLU(inplace=True)
            self.maxpool = tnn.Identity() if small_input else tnn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(64, layers[0])
            self.layer2 = self._make_layer(128, layers[1], 2)
            self.layer3 = self._make_layer(256, layers[2], 2)
            self.layer4 = self._make_layer(512, layers[3], 2)
            self.avgpool = tnn.AdaptiveAvgPool2d((1, 1))
            self.fc = tnn.Linear(512 * blocks.expansion, num_classes)

        def _make_layer(self, planes, n, stride=1):
            downsample = None
            if stride != 1 or self.inplanes != planes * blocks.expansion:
                downsample = tnn.Sequential(conv1x1(self.inplanes, planes * blocks.expansion,
                                                    stride),
                                            tnn.BatchNorm2d(planes * blocks.expansion))
            out = [blocks(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * blocks.expansion
            out += [blocks(self.inplanes, planes) for _ in range(1, n)]
            return tnn.Sequential(*out)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet()


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
    ref = _torch_resnet(block, layers, num_classes=10, **kw)
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
