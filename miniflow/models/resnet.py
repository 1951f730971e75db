"""ResNet-18/34/50 with torchvision's structure, module names and initialisation
(``torchvision/models/resnet.py``, "ResNet v1.5": the stride of a bottleneck is on its 3x3
convolution), so a torchvision ``state_dict`` (converted to NumPy) loads with
``load_state_dict`` and gives the same outputs.

He et al., "Deep Residual Learning for Image Recognition", CVPR 2016.

Layout: ``conv1`` (7x7, stride 2, pad 3) -> ``bn1`` -> ``relu`` -> ``maxpool`` (3x3, stride 2,
pad 1) -> ``layer1`` .. ``layer4`` (64, 128, 256, 512 planes; stride 2 from ``layer2`` on) ->
``avgpool`` (adaptive, 1x1) -> flatten -> ``fc``. ``small_input=True`` gives the CIFAR-style stem
for small images such as the 8x8 digits: ``conv1`` is 3x3 with stride 1 and pad 1 and ``maxpool``
is an identity (same module names, so the state dict has the same keys; ``conv1.weight`` is then
``[64, in_channels, 3, 3]``).
"""
from __future__ import annotations

import math

import numpy as np

from .. import nn
from ..random import generator

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet34", "resnet50"]


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution, padding 1, no bias (torchvision's ``conv3x3``)."""
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    """1x1 convolution, no bias (torchvision's ``conv1x1``)."""
    return nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 (reduce) -> 3x3 (stride) -> 1x1 (expand x4) convolutions with batch norm and a
    residual connection (ResNet-50)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ``ResNet`` (see the module docstring).

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        layers: blocks per stage, e.g. ``[2, 2, 2, 2]`` for ResNet-18.
        num_classes: outputs of ``fc`` (1000).
        in_channels: channels of the input images (3; 1 for the digits).
        small_input: the 3x3 stride-1 stem without max pool, for small images.
        zero_init_residual: start the last batch norm of every block at 0 (torchvision's option).

    Initialisation (torchvision's): convolutions ``kaiming_normal_(mode="fan_out",
    nonlinearity="relu")``, i.e. N(0, 2 / (out_channels * kh * kw)); batch norm weight 1, bias 0;
    ``fc`` as ``nn.Linear``.
    """

    def __init__(self, block, layers, num_classes: int = 1000, in_channels: int = 3,
                 small_input: bool = False, zero_init_residual: bool = False):
        super().__init__()
        if len(layers) != 4 or not all(isinstance(n, int) and n >= 1 for n in layers):
            raise ValueError(f"ResNet: layers must be 4 positive block counts, got {layers!r}")
        self.inplanes = 64
        if small_input:
            self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.Identity() if small_input else nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, 64, layers[0])
        self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)
        g = generator()
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1]
                std = math.sqrt(2.0 / fan_out)
                m.weight = nn.Parameter(g.normal(0.0, std, m.weight.shape).astype(np.float32))
        if zero_init_residual:
            for m in self.modules():
                last = getattr(m, "bn3", None) if isinstance(m, Bottleneck) else \
                    getattr(m, "bn2", None) if isinstance(m, BasicBlock) else None
                if last is not None:
                    last.weight = nn.Parameter(np.zeros(last.num_features, np.float32))

    def _make_layer(self, block, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(nn.functional.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000, **kw) -> ResNet:
    """ResNet-18: :class:`BasicBlock` x [2, 2, 2, 2] (11.7M parameters at 1000 classes)."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, **kw)


def resnet34(num_classes: int = 1000, **kw) -> ResNet:
    """ResNet-34: :class:`BasicBlock` x [3, 4, 6, 3]."""
    return ResNet(BasicBlock, [3, 4, 6, 3], num_classes, **kw)


def resnet50(num_classes: int = 1000, **kw) -> ResNet:
    """ResNet-50: :class:`Bottleneck` x [3, 4, 6, 3] (25.6M parameters at 1000 classes)."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, **kw)
