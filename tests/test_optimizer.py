"""The optimizer objects themselves (``miniflow.optim``): their lifetime and their param group.

PyTorch's ``test/optim/test_lrscheduler.py`` (``test_no_cyclic_references``): with the cyclic
collector off, deleting an optimizer or a scheduler frees it at once (nothing of theirs is in a
reference cycle); miniflow checks that for every optimizer and scheduler class it exports.
``opt.param_groups[0] |= {...}`` updates the group in place, as on PyTorch's list of dicts.
"""
import gc
import inspect
import weakref

import pytest

import miniflow as mf
from miniflow import nn
from miniflow.optim import Optimizer, lr_scheduler

OPTIMIZERS = {mf.optim.SGD: dict(lr=0.1, momentum=0.9, weight_decay=0.01),
              mf.optim.Adam: dict(lr=0.01)}
"""Every exported optimizer class -> constructor arguments."""

SCHEDULERS = {
    "LRScheduler": None,  # the base class (abstract get_lr): its subclasses are tested
    "StepLR": lambda o: lr_scheduler.StepLR(o, step_size=2),
    "MultiStepLR": lambda o: lr_scheduler.MultiStepLR(o, milestones=[1, 3]),
    "CosineAnnealingLR": lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=4),
    "LinearLR": lambda o: lr_scheduler.LinearLR(o),
    "LambdaLR": lambda o: lr_scheduler.LambdaLR(o, lambda epoch: 0.5 ** epoch),
    "SequentialLR": lambda o: lr_scheduler.SequentialLR(
        o, [lr_scheduler.LinearLR(o), lr_scheduler.StepLR(o, 2)], milestones=[2]),
}
"""Every name of ``lr_scheduler.__all__`` -> a factory of that scheduler on an optimizer."""


@pytest.fixture
def no_cyclic_gc():
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    yield
    if was:
        gc.enable()


def _sgd():
    return mf.optim.SGD(nn.Linear(3, 2).parameters(), lr=0.5)


def test_every_optimizer_and_scheduler_class_is_listed_here():
    exported = {c for c in vars(mf.optim).values()
                if inspect.isclass(c) and issubclass(c, Optimizer) and c is not Optimizer}
    assert exported == set(OPTIMIZERS)
    assert set(lr_scheduler.__all__) == set(SCHEDULERS)


@pytest.mark.parametrize("cls", list(OPTIMIZERS), ids=lambda c: c.__name__)
def test_an_optimizer_is_freed_on_del_without_the_cyclic_collector(no_cyclic_gc, cls):
    opt = cls(nn.Linear(3, 2).parameters(), **OPTIMIZERS[cls])
    group = opt.param_groups[0]
    group["lr"] = 0.05
    group.update(weight_decay=0.0)
    ref = weakref.ref(opt)
    del opt
    assert ref() is None
    with pytest.raises(ReferenceError, match="optimizer was deleted; its values cannot be changed"):
        group["lr"] = 0.1
    assert group["lr"] == 0.05  # a kept group still reads


@pytest.mark.parametrize("name", [n for n, f in SCHEDULERS.items() if f is not None])
def test_a_scheduler_and_its_optimizer_are_freed_on_del_after_steps(no_cyclic_gc, name):
    opt = _sgd()
    sched = SCHEDULERS[name](opt)
    for _ in range(3):
        sched.step()
    refs = weakref.ref(opt), weakref.ref(sched)
    del sched
    assert refs[1]() is None
    del opt
    assert refs[0]() is None


def test_param_group_ior_changes_the_group_in_place_and_raises_nothing():
    """PyTorch's ``param_groups`` is a list of dicts: ``param_groups[0] |= {"lr": ...}`` updates
    the dict and puts the same dict back. miniflow's check runs first (all or nothing)."""
    opt = _sgd()
    group = opt.param_groups[0]
    opt.param_groups[0] |= {"lr": 1e-30}
    assert group["lr"] == 1e-30 and opt.learning_rate[0] == 1e-30 and opt.version == 0
    opt.param_groups[-1] |= {"momentum": 0.5}
    assert opt.hyper["momentum"] == 0.5 and opt.version == 1
    with pytest.raises(ValueError, match="lr must be finite"):
        opt.param_groups[0] |= {"lr": -1.0, "momentum": 0.1}
    assert opt.hyper["lr"] == 1e-30 and opt.hyper["momentum"] == 0.5


def test_a_refused_param_groups_assignment_changes_nothing():
    opt = _sgd()
    other = _sgd().param_groups[0]
    for value in ({"lr": 1e-30}, other, dict(opt.param_groups[0], lr=1e-30)):
        with pytest.raises(TypeError, match="param_groups cannot be changed"):
            opt.param_groups[0] = value
    with pytest.raises(TypeError, match="param_groups cannot be changed"):
        opt.param_groups[1] = opt.param_groups[0]
    with pytest.raises(TypeError, match="param_groups cannot be changed"):
        del opt.param_groups[0]
    assert opt.hyper["lr"] == 0.5 and opt.learning_rate[0] == 0.5 and opt.version == 0
