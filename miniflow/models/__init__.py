"""Models built from ``miniflow.nn`` layers: torchvision's ResNets (``resnet18``, ``resnet34``,
``resnet50``, same structure and ``state_dict`` keys, so a torchvision state dict loads) and a
LeNet-style convolutional network for the 8x8 digits (``lenet``)."""
from .lenet import LeNet, lenet
from .resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50

__all__ = ["BasicBlock", "Bottleneck", "LeNet", "ResNet", "lenet", "resnet18", "resnet34",
           "resnet50"]
