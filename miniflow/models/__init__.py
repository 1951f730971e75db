"""Models built from ``miniflow.nn`` layers: torchvision's ResNets (``resnet18``, ``resnet34``,
``resnet50``, same structure and ``state_dict`` keys, so a torchvision state dict loads), a
LeNet-style convolutional network for the 8x8 digits (``lenet``) and a minGPT-style decoder
(``gpt``, nanoGPT's module names and state-dict keys)."""
from .gpt import GPT, gpt
from .lenet import LeNet, lenet
from .resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet34, resnet50

__all__ = ["BasicBlock", "Bottleneck", "GPT", "LeNet", "ResNet", "gpt", "lenet", "resnet18",
           "resnet34", "resnet50"]
