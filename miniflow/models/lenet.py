"""A LeNet-style convolutional network for the 8x8 digits (LeCun et al., "Gradient-based learning
applied to document recognition", 1998: convolution and subsampling stages, then fully connected
layers), with batch norm after each convolution (Ioffe & Szegedy, 2015) by default:

``conv1`` (3x3, pad 1, 1 -> 16) -> ``bn1`` -> ReLU -> 2x2 max pool (8x8 -> 4x4) -> ``conv2``
(3x3, pad 1, 16 -> 32) -> ``bn2`` -> ReLU -> 2x2 max pool (-> 2x2) -> flatten (128) -> ``fc1``
(128 -> 64) -> ReLU -> ``fc2`` (64 -> classes). 13.8K parameters.
"""
from __future__ import annotations

from .. import nn

__all__ = ["LeNet", "lenet"]


class LeNet(nn.Module):
    """See the module docstring. ``batch_norm=False`` replaces the batch norms by identities
    (and gives the convolutions a bias); ``width`` scales the channels (16 and 32)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, batch_norm: bool = True,
                 width: int = 16, image_size: int = 8):
        super().__init__()
        if image_size % 4:
            raise ValueError(f"LeNet: image_size must be a multiple of 4 (two 2x2 pools), got "
                             f"{image_size}")
        c1, c2 = width, 2 * width
        self.conv1 = nn.Conv2d(in_channels, c1, 3, padding=1, bias=not batch_norm)
        self.bn1 = nn.BatchNorm2d(c1) if batch_norm else nn.Identity()
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1, bias=not batch_norm)
        self.bn2 = nn.BatchNorm2d(c2) if batch_norm else nn.Identity()
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(c2 * (image_size // 4) ** 2, 4 * width)
        self.fc2 = nn.Linear(4 * width, num_classes)

    def forward(self, x):
        x = self.pool(self.relu(self.bn1(self.conv1(x))))
        x = self.pool(self.relu(self.bn2(self.conv2(x))))
        return self.fc2(self.relu(self.fc1(self.flatten(x))))


def lenet(num_classes: int = 10, **kw) -> LeNet:
    """The digits LeNet (:class:`LeNet`)."""
    return LeNet(num_classes, **kw)
