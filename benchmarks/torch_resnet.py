"""ResNets in PyTorch written exactly as torchvision's ``torchvision/models/resnet.py`` (v1.5:
the stride of a bottleneck on its 3x3 convolution; same module names, so the state dict keys are
torchvision's), for the ResNet-50 benchmark and the tests that load a PyTorch state dict into
``miniflow.models`` (torchvision itself is not needed). Imports torch: use only where it is
installed."""
from __future__ import annotations

import torch
from torch import nn as tnn

__all__ = ["torch_resnet", "torch_resnet50"]


def torch_resnet(block: str, layers, num_classes: int = 1000, in_channels: int = 3,
                 small_input: bool = False) -> "tnn.Module":
    """A ResNet written exactly as torchvision's ``torchvision/models/resnet.py`` (v1.5): same
    modules, names and forward. ``block``: ``"basic"`` (ResNet-18/34) or ``"bottleneck"``
    (ResNet-50); ``layers``: blocks per stage; ``small_input``: miniflow's small-input stem (3x3
    stride-1 ``conv1``, identity ``maxpool``) for comparing ``miniflow.models.resnet18(...,
    small_input=True)``."""
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


def torch_resnet50(num_classes: int = 1000) -> "tnn.Module":
    """torchvision's ``resnet50(num_classes=...)`` (with PyTorch's default initialisation; load
    miniflow's weights into it to compare the two)."""
    return torch_resnet("bottleneck", [3, 4, 6, 3], num_classes)
