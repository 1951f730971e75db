"""Learning-rate schedulers against PyTorch: the lr sequences of ``fixtures/lr_schedules.json``
(made by ``fixtures/make_lr_schedules.py``) and live when torch is installed; state dicts
(PyTorch's loading into miniflow's and back, through ``miniflow.save``); argument checks; with
an nn.Graph: a new lr every step never recompiles and trains as the float64 oracle with that lr
sequence, and steps skipped by the grad scaler do not advance a schedule."""
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow import load, nn, save
from miniflow.data import batches, load_digits
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.optim import lr_scheduler
from miniflow.optim.lr_scheduler import (ChainedScheduler, ConstantLR, CosineAnnealingLR,
                                         CosineAnnealingWarmRestarts, ExponentialLR, LambdaLR,
                                         LinearLR, LRScheduler, MultiplicativeLR, MultiStepLR,
                                         PolynomialLR, ReduceLROnPlateau, SequentialLR, StepLR)

from reference_mlp import adadelta_step, adam_step, forward_backward, sgd_step

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
import lr_schedule_configs as cfg  # noqa: E402

FIXTURE = json.loads((FIXTURES / "lr_schedules.json").read_text())


class FakeOptimizer:
    """Just ``param_groups``: a list of dicts with ``"lr"`` (PyTorch's layout)."""

    def __init__(self, lrs):
        self.param_groups = [{"lr": lr} for lr in lrs]


def sgd(lr=0.1):
    mf.manual_seed(0)
    return mf.optim.SGD(nn.Linear(3, 2).parameters(), lr=lr, momentum=0.9)


def assert_lrs_equal(got, expected):
    """To 1e-12 relative (in practice the sequences are bit-identical: the same float ops)."""
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-12, atol=1e-15)


# ------------------------------------------------------------------------- against PyTorch
@pytest.mark.parametrize("name", sorted(cfg.CONFIGS))
def test_lr_sequence_matches_the_pytorch_fixture(name):
    lrs, spec = cfg.CONFIGS[name]
    opt = FakeOptimizer(lrs)
    sched = cfg.build(lr_scheduler, opt, spec)
    got = cfg.lr_sequence(sched)
    assert len(got) == cfg.NUM_STEPS + 1
    assert_lrs_equal(got, FIXTURE["configs"][name]["lrs"])
    assert [g["lr"] for g in opt.param_groups] == got[-1]


@pytest.mark.parametrize("name", [n for n, (lrs, _) in sorted(cfg.CONFIGS.items())
                                  if len(lrs) == 1])
def test_lr_sequence_on_a_miniflow_optimizer(name):
    """A real SGD: every change of lr goes through its validated ParamGroup into the optimizer's
    learning-rate array (what a compiled graph reads) and changes no compiled hyper-parameter
    (the version stays)."""
    lrs, spec = cfg.CONFIGS[name]
    opt = sgd(lrs[0])
    sched = cfg.build(lr_scheduler, opt, spec)
    seen = []

    def record():
        seen.append((opt.param_groups[0]["lr"], float(opt.learning_rate[0])))
    got = cfg.lr_sequence(sched, record)
    assert_lrs_equal(got, FIXTURE["configs"][name]["lrs"])
    assert [lr for lr, _ in seen] == [g[0] for g in got[:-1]]
    assert all(lr == held for lr, held in seen) and opt.version == 0


def test_lr_sequences_match_live_pytorch():
    pytest.importorskip("torch")
    import make_lr_schedules as make
    live = make.schedules()["configs"]
    for name, (lrs, spec) in cfg.CONFIGS.items():
        got = cfg.lr_sequence(cfg.build(lr_scheduler, FakeOptimizer(lrs), spec))
        assert_lrs_equal(got, live[name]["lrs"])


@pytest.mark.parametrize("name", sorted(cfg.CONFIGS))
def test_a_pytorch_state_dict_loads_and_the_schedule_continues(name):
    """The fixture's torch state dict after STATE_AT steps, loaded into a fresh miniflow
    scheduler whose optimizer has the lr of that step (as optimizer.load_state_dict does)."""
    lrs, spec = cfg.CONFIGS[name]
    expected = FIXTURE["configs"][name]["lrs"]
    opt = FakeOptimizer(lrs)
    sched = cfg.build(lr_scheduler, opt, spec)
    for g, lr in zip(opt.param_groups, expected[cfg.STATE_AT]):
        g["lr"] = lr
    sched.load_state_dict(cfg.from_json(FIXTURE["configs"][name]["state"]))
    assert sched.get_last_lr() == expected[cfg.STATE_AT]
    assert_lrs_equal(cfg.lr_sequence(sched, steps=cfg.NUM_STEPS - cfg.STATE_AT),
                     expected[cfg.STATE_AT:])


def test_pytorch_schedulers_load_miniflow_state_dicts():
    torch = pytest.importorskip("torch")
    import make_lr_schedules as make
    for name, (lrs, spec) in cfg.CONFIGS.items():
        ours = cfg.build(lr_scheduler, FakeOptimizer(lrs), spec)
        cfg.lr_sequence(ours, steps=cfg.STATE_AT)
        topt = make.torch_optimizer(lrs)
        theirs = cfg.build(torch.optim.lr_scheduler, topt, spec)
        for g, lr in zip(topt.param_groups, ours.get_last_lr()):
            g["lr"] = lr
        theirs.load_state_dict(ours.state_dict())
        rest = cfg.NUM_STEPS - cfg.STATE_AT
        assert_lrs_equal(cfg.lr_sequence(theirs, topt.step, rest),
                         cfg.lr_sequence(ours, steps=rest))


@pytest.mark.parametrize("name", sorted(cfg.CONFIGS))
def test_resume_through_miniflow_save_continues_the_same_sequence(tmp_path, name):
    lrs, spec = cfg.CONFIGS[name]
    opt = FakeOptimizer(lrs)
    sched = cfg.build(lr_scheduler, opt, spec)
    cfg.lr_sequence(sched, steps=37)
    save({"scheduler": sched.state_dict(), "lrs": [g["lr"] for g in opt.param_groups]},
         tmp_path / "s.safetensors")
    straight = cfg.lr_sequence(sched, steps=40)

    ckpt = load(tmp_path / "s.safetensors")
    opt2 = FakeOptimizer(lrs)
    sched2 = cfg.build(lr_scheduler, opt2, spec)
    for g, lr in zip(opt2.param_groups, ckpt["lrs"]):
        g["lr"] = lr
    sched2.load_state_dict(ckpt["scheduler"])
    assert cfg.lr_sequence(sched2, steps=40) == straight
    assert sched2.state_dict() == sched.state_dict()


def test_resume_recipe_with_a_miniflow_optimizer(tmp_path):
    """PyTorch's order: make the optimizer and the schedulers, then load the optimizer's state
    (it holds the current lr) and the scheduler's."""
    def make():
        opt = sgd(0.1)
        return opt, SequentialLR(opt, [LinearLR(opt, 0.1, total_iters=10),
                                       CosineAnnealingLR(opt, T_max=90)], milestones=[10])
    opt, sched = make()
    cfg.lr_sequence(sched, steps=37)
    save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, tmp_path / "c.st")
    straight = cfg.lr_sequence(sched, steps=40)
    assert_lrs_equal(straight, FIXTURE["configs"]["warmup_then_cosine"]["lrs"][37:78])

    opt2, sched2 = make()
    ckpt = load(tmp_path / "c.st")
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    assert cfg.lr_sequence(sched2, steps=40) == straight


def test_resume_after_add_param_group_loads_the_shorter_base_lrs(tmp_path):
    """A scheduler made before add_param_group has base_lrs for the groups it saw only (as
    PyTorch's); its state dict, saved and loaded into a scheduler of the grown optimizer (as a
    resume makes them), gives the same lrs. It was refused (base_lrs of the wrong length)."""
    def make(groups):
        mf.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
        opt = mf.optim.SGD([{"params": model[0].parameters(), "name": "body"}], lr=0.1)
        if groups == 2:
            opt.add_param_group({"params": list(model[1].parameters()), "lr": 0.01})
        return model, opt, StepLR(opt, 2, gamma=0.5)
    model, opt, sched = make(1)
    sched.step()
    opt.add_param_group({"params": list(model[1].parameters()), "lr": 0.01, "name": "head"})
    cfg.lr_sequence(sched, steps=3)
    save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, tmp_path / "c.st")
    assert sched.state_dict()["base_lrs"] == [0.1]
    straight = cfg.lr_sequence(sched, steps=5)

    _, opt2, sched2 = make(2)
    ckpt = load(tmp_path / "c.st")
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    assert sched2.base_lrs == [0.1] and opt2.param_groups[1]["name"] == "head"
    assert cfg.lr_sequence(sched2, steps=5) == straight
    torch = pytest.importorskip("torch")
    t_opt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]}], lr=0.1)
    t_sched = torch.optim.lr_scheduler.StepLR(t_opt, 2, gamma=0.5)
    t_opt.add_param_group({"params": [torch.zeros(1, requires_grad=True)], "lr": 0.01})
    t_opt.step()
    t_sched.step()
    _, opt3, sched3 = make(2)
    sched3.load_state_dict(t_sched.state_dict())
    assert sched3.base_lrs == [0.1] and sched3.last_epoch == 1
    with pytest.raises(ValueError, match=r"base_lrs must be a list of 1 to 2 numbers"):
        sched3.load_state_dict({**t_sched.state_dict(), "base_lrs": [0.1, 0.1, 0.1]})


@pytest.mark.parametrize("make", [lambda opt: CosineAnnealingLR(opt, T_max=2),
                                  lambda opt: LambdaLR(opt, lambda e: 0.5 ** e),
                                  lambda opt: SequentialLR(opt, [ConstantLR(opt, 0.5, 1),
                                                                 StepLR(opt, 1)], [1])],
                         ids=["cosine", "lambda", "sequential"])
def test_a_schedule_from_base_lrs_names_groups_added_after_it(make):
    """A schedule that computes an lr from each group's base lr (cosine's step past T_max,
    LambdaLR, a closed form at a SequentialLR milestone) has none for a group added after it
    was made: PyTorch fails with zip's "argument 2 is longer than argument 1", and so did
    miniflow; now a ValueError says what happened and what to do, and the step changes
    nothing. Chainable schedules (StepLR ...) go on, as PyTorch's."""
    mf.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    opt = mf.optim.SGD([{"params": model[0].parameters(), "name": "body"}], lr=0.1)
    sched = make(opt)
    opt.add_param_group({"params": list(model[1].parameters()), "lr": 0.01})
    with pytest.raises(ValueError, match=r"the optimizer has 2 param groups but this scheduler "
                                         r"has base_lrs for 1 \(\[0.1\]\): groups were added "
                                         r"with add_param_group after the scheduler was made"):
        for _ in range(4):
            before = (sched.state_dict(), [g["lr"] for g in opt.param_groups])
            sched.step()
    assert (sched.state_dict(), [g["lr"] for g in opt.param_groups]) == before


# ----------------------------------------------------------------------------- semantics
def test_a_scheduler_made_after_a_warm_up_starts_from_the_initial_lr():
    """PyTorch's group["initial_lr"], set by the first scheduler of the optimizer."""
    opt = sgd(0.1)
    warm = LinearLR(opt, start_factor=0.1, total_iters=4)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    cos = CosineAnnealingLR(opt, T_max=10)
    assert warm.base_lrs == cos.base_lrs == [0.1]
    other = FakeOptimizer([0.5])
    assert StepLR(other, 3).base_lrs == [0.5]  # per optimizer
    opt.param_groups[0]["lr"] = 0.3  # PyTorch's setdefault: the first record stays
    assert StepLR(opt, 3).base_lrs == [0.1]


def test_initial_lr_is_a_checked_param_group_key_outside_the_compiled_graph():
    """The one key a ParamGroup lets a scheduler add: checked like lr, saved and loaded with the
    optimizer (PyTorch's layout), and never a reason to recompile."""
    opt = sgd(0.1)
    assert "initial_lr" not in opt.param_groups[0]
    StepLR(opt, 3)
    assert opt.param_groups[0]["initial_lr"] == 0.1 and opt.version == 0
    assert opt.state_dict()["param_groups"][0]["initial_lr"] == 0.1
    with pytest.raises(ValueError, match=r"SGD: initial_lr must be finite and in \[0, inf\), "
                                         r"got -1.0"):
        opt.param_groups[0]["initial_lr"] = -1.0
    with pytest.raises(ValueError, match=r"\['maximize'\] = True; miniflow's SGD runs only"):
        opt.param_groups[0].setdefault("maximize", True)  # PyTorch's key: checked
    assert opt.param_groups[0].setdefault("name", "head") == "head" and opt.version == 0
    fresh = sgd(0.1)  # no scheduler yet: loading a group with initial_lr adds it
    fresh.load_state_dict(opt.state_dict())
    assert fresh.param_groups[0]["initial_lr"] == 0.1 and StepLR(fresh, 3).base_lrs == [0.1]
    bad = opt.state_dict()
    bad["param_groups"][0]["initial_lr"] = float("nan")
    with pytest.raises(ValueError, match=r"param_groups\[0\]: SGD: initial_lr must be finite"):
        sgd(0.1).load_state_dict(bad)


def test_initial_lr_may_be_none_as_in_pytorch_and_a_scheduler_then_names_it():
    """PyTorch's group keeps ``setdefault("initial_lr", None)``; its scheduler made afterwards
    (last_epoch=-1) keeps the None as base lr. miniflow's group keeps it too (saved and loaded),
    and a scheduler refuses it at once, naming the group and what to do."""
    opt = sgd(0.1)
    assert opt.param_groups[0].setdefault("initial_lr", None) is None
    assert opt.param_groups[0]["initial_lr"] is None and opt.version == 0
    assert opt.state_dict()["param_groups"][0]["initial_lr"] is None
    fresh = sgd(0.1)
    fresh.load_state_dict(opt.state_dict())
    assert fresh.param_groups[0]["initial_lr"] is None
    with pytest.raises(TypeError, match=r"StepLR: param_groups\[0\]\['initial_lr'\] is None, "
                                        r".*set it to a number"):
        StepLR(opt, 3)
    assert opt.param_groups[0]["initial_lr"] is None and opt.param_groups[0]["lr"] == 0.1
    opt.param_groups[0]["initial_lr"] = 0.2
    assert StepLR(opt, 3).base_lrs == [0.2]


def test_step_sets_every_param_group_and_get_last_lr_is_a_copy():
    opt = FakeOptimizer([0.1, 0.01])
    sched = StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(2):
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.005] == sched.get_last_lr()
    sched.get_last_lr().append(1.0)
    assert sched.get_last_lr() == [0.05, 0.005] and sched.last_epoch == 2


def test_cosine_follows_pytorchs_recursion_not_the_closed_form():
    """PyTorch's get_lr recursion, written out here, is matched exactly; the textbook closed
    form differs from it by rounding (~1e-14 relative: below the fixture tests' 1e-12, so this
    test is the one that tells them apart)."""
    t, lo, base = 30, 0.001, 0.1
    opt = FakeOptimizer([base])
    got = [lr[0] for lr in cfg.lr_sequence(CosineAnnealingLR(opt, T_max=t, eta_min=lo),
                                           steps=95)]
    expected = [base]
    for e in range(1, 96):
        lr = expected[-1]
        if (e - 1 - t) % (2 * t) == 0:
            expected.append(lr + (base - lo) * (1 - math.cos(math.pi / t)) / 2)
        else:
            expected.append((1 + math.cos(math.pi * e / t)) / (1 + math.cos(math.pi * (e - 1) / t))
                            * (lr - lo) + lo)
    assert got == expected
    closed = [lo + (base - lo) * (1 + math.cos(math.pi * e / t)) / 2 for e in range(96)]
    assert got != closed
    np.testing.assert_allclose(got, closed, rtol=1e-12)
    assert got[30] == pytest.approx(lo) and got[60] == pytest.approx(base)  # rises past T_max


def test_multistep_repeated_milestones_multiply_by_gamma_per_repeat():
    opt = FakeOptimizer([1.0])
    sched = MultiStepLR(opt, milestones=[2, 2, 2, 5], gamma=0.5)
    assert [lr[0] for lr in cfg.lr_sequence(sched, steps=6)] == [1, 1, 0.125, 0.125, 0.125,
                                                                0.0625, 0.0625]
    assert sched.state_dict()["milestones"] == Counter({2: 3, 5: 1})


def test_a_failed_step_changes_nothing():
    opt = FakeOptimizer([0.1])
    sched = LambdaLR(opt, lambda e: float("nan") if e == 3 else 1.0 / (e + 1))
    sched.step()
    sched.step()
    with pytest.raises(ValueError, match=r"LambdaLR: the lr of param group 0 at epoch 3 must be "
                                         r"finite .*got nan"):
        sched.step()
    assert sched.last_epoch == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.1 / 3)
    assert sched.get_last_lr() == [opt.param_groups[0]["lr"]]

    real = sgd(0.1)  # the ParamGroup refuses a negative lr: the step is undone the same way
    neg = LambdaLR(real, lambda e: 1.0 - e)
    neg.step()
    with pytest.raises(ValueError, match=r"SGD: lr must be finite and in \[0, inf\)"):
        neg.step()
    assert neg.last_epoch == 1 and real.param_groups[0]["lr"] == 0.0 == neg.get_last_lr()[0]


def test_lambda_lr_saves_callable_objects_attributes_not_functions():
    class Factor:
        def __init__(self, base):
            self.base = base

        def __call__(self, epoch):
            return self.base ** epoch

    opt = FakeOptimizer([1.0, 1.0])
    sched = LambdaLR(opt, [Factor(0.5), lambda e: 1.0])
    assert sched.state_dict()["lr_lambdas"] == [{"base": 0.5}, None]
    fresh = LambdaLR(FakeOptimizer([1.0, 1.0]), [Factor(0.9), lambda e: 1.0])
    fresh.load_state_dict(sched.state_dict())
    assert fresh.lr_lambdas[0].base == 0.5
    fresh.step()
    assert fresh.get_last_lr() == [0.5, 1.0]


def test_multiplicative_lr_multiplies_the_current_lr_as_pytorchs():
    """MultiplicativeLR (torch.optim.lr_scheduler's) was an AttributeError: lr_e = lr_(e-1) *
    lr_lambda(e) from epoch 1, one function per group or one for all, a lr set by other code
    carried on; its state dict loads into PyTorch's and back; a SequentialLR phase."""
    class Factor:
        def __init__(self, f):
            self.f = f

        def __call__(self, epoch):
            return self.f
    fns = lambda: [Factor(0.9), lambda e: 1.0 / (1.0 + 0.1 * e)]  # noqa: E731
    opt = FakeOptimizer([0.1, 0.02])
    sched = MultiplicativeLR(opt, fns())
    expected = [[0.1, 0.02]]
    for e in range(1, 7):
        sched.step()
        expected.append([expected[-1][0] * 0.9, expected[-1][1] / (1.0 + 0.1 * e)])
        assert_lrs_equal(sched.get_last_lr(), expected[-1])
    opt.param_groups[0]["lr"] = 0.5                     # carried on, as PyTorch's
    sched.step()
    assert_lrs_equal(sched.get_last_lr(), [0.45, expected[-1][1] / 1.7])
    assert sched.state_dict()["lr_lambdas"] == [{"f": 0.9}, None]
    with pytest.raises(TypeError, match="MultiplicativeLR: lr_lambda 0 must be callable"):
        MultiplicativeLR(FakeOptimizer([0.1]), 0.5)
    torch = pytest.importorskip("torch")
    import make_lr_schedules as make
    topt = make.torch_optimizer([0.1, 0.02])
    theirs = torch.optim.lr_scheduler.MultiplicativeLR(topt, fns())
    ours = MultiplicativeLR(FakeOptimizer([0.1, 0.02]), fns())
    assert_lrs_equal(cfg.lr_sequence(ours, steps=4), cfg.lr_sequence(theirs, topt.step, 4))
    again = MultiplicativeLR(FakeOptimizer(ours.get_last_lr()), fns())
    again.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    assert again.last_epoch == theirs.last_epoch == 4
    assert_lrs_equal(cfg.lr_sequence(again, steps=4), cfg.lr_sequence(theirs, topt.step, 4))
    seqs = []
    for module, o in ((lr_scheduler, FakeOptimizer([0.1])), (torch.optim.lr_scheduler,
                                                             make.torch_optimizer([0.1]))):
        seqs.append(cfg.lr_sequence(module.SequentialLR(o, [
            module.ConstantLR(o, 0.5, total_iters=3),
            module.MultiplicativeLR(o, lambda e: 0.8)], [3]), getattr(o, "step", lambda: None)))
    assert_lrs_equal(*seqs)


def test_sequential_lr_state_holds_each_schedulers_state():
    opt = FakeOptimizer([0.1])
    seq = SequentialLR(opt, [LinearLR(opt, 0.5, total_iters=2), StepLR(opt, 3)], milestones=[2])
    state = seq.state_dict()
    assert sorted(state) == ["_last_lr", "_milestones", "_optimizer_steps_seen", "_schedulers",
                             "last_epoch"]
    assert [sorted(s) for s in state["_schedulers"]] == [
        ["_last_lr", "_optimizer_steps_seen", "_step_count", "base_lrs", "end_factor",
         "last_epoch", "start_factor", "total_iters"],
        ["_last_lr", "_optimizer_steps_seen", "_step_count", "base_lrs", "gamma", "last_epoch",
         "step_size"]]
    assert state["_schedulers"][1]["last_epoch"] == -1  # waits for its milestone


# ------------------------------------------------------------------------- argument checks
O = FakeOptimizer


@pytest.mark.parametrize("make, error, match", [
    (lambda: StepLR(O([0.1]), 0), ValueError, r"StepLR: step_size must be an integer >= 1, got 0"),
    (lambda: StepLR(O([0.1]), 2.5), ValueError, r"step_size must be an integer >= 1, got 2.5"),
    (lambda: StepLR(O([0.1]), True), ValueError, r"step_size must be an integer"),
    (lambda: StepLR(O([0.1]), 3, gamma=0), ValueError,
     r"StepLR: gamma must be finite and in \(0, inf\), got 0"),
    (lambda: StepLR(O([0.1]), 3, gamma=-0.5), ValueError, r"gamma must be finite .*got -0.5"),
    (lambda: StepLR(O([0.1]), 3, gamma=float("nan")), ValueError, r"gamma .*got nan"),
    (lambda: StepLR(O([0.1]), 3, gamma="0.1"), TypeError,
     r"StepLR: gamma must be a real number, got '0.1'"),
    (lambda: MultiStepLR(O([0.1]), [30, 10]), ValueError,
     r"MultiStepLR: milestones must be non-decreasing, got \[30, 10\]"),
    (lambda: MultiStepLR(O([0.1]), [-1, 5]), ValueError,
     r"milestones\[0\] must be an integer >= 0, got -1"),
    (lambda: MultiStepLR(O([0.1]), 5), TypeError, r"milestones must be a list of integers"),
    (lambda: MultiStepLR(O([0.1]), [5], gamma=0.0), ValueError, r"MultiStepLR: gamma"),
    (lambda: CosineAnnealingLR(O([0.1]), 0), ValueError,
     r"CosineAnnealingLR: T_max must be an integer >= 1, got 0"),
    (lambda: CosineAnnealingLR(O([0.1]), 10, eta_min=-0.1), ValueError,
     r"eta_min must be finite and in \[0, inf\), got -0.1"),
    (lambda: LinearLR(O([0.1]), start_factor=0), ValueError,
     r"LinearLR: start_factor must be finite and in \(0, 1\], got 0"),
    (lambda: LinearLR(O([0.1]), start_factor=1.5), ValueError, r"start_factor .*got 1.5"),
    (lambda: LinearLR(O([0.1]), end_factor=-0.1), ValueError,
     r"end_factor must be finite and in \[0, 1\], got -0.1"),
    (lambda: LinearLR(O([0.1]), end_factor=1.1), ValueError, r"end_factor .*got 1.1"),
    (lambda: LinearLR(O([0.1]), total_iters=0), ValueError, r"total_iters must be an integer >= 1"),
    (lambda: ExponentialLR(O([0.1]), 0.0), ValueError,
     r"ExponentialLR: gamma must be finite and in \(0, inf\), got 0.0"),
    (lambda: ExponentialLR(O([0.1]), "0.9"), TypeError, r"gamma must be a real number"),
    (lambda: ConstantLR(O([0.1]), factor=0.0), ValueError,
     r"ConstantLR: factor must be finite and in \(0, 1\], got 0.0"),
    (lambda: ConstantLR(O([0.1]), factor=2), ValueError, r"factor .*got 2"),
    (lambda: ConstantLR(O([0.1]), total_iters=0), ValueError,
     r"ConstantLR: total_iters must be an integer >= 1, got 0"),
    (lambda: PolynomialLR(O([0.1]), total_iters=0), ValueError,
     r"PolynomialLR: total_iters must be an integer >= 1, got 0"),
    (lambda: PolynomialLR(O([0.1]), power=-1.0), ValueError,
     r"power must be finite and in \[0, inf\), got -1.0"),
    (lambda: LambdaLR(O([0.1]), 0.5), TypeError, r"LambdaLR: lr_lambda 0 must be callable"),
    (lambda: LambdaLR(O([0.1, 0.2]), [abs]), ValueError,
     r"expected 2 lr_lambdas \(one per param group\), got 1"),
    (lambda: StepLR(object(), 3), TypeError,
     r"StepLR: expected an optimizer \(an object whose param_groups is a non-empty list"),
    (lambda: StepLR(O([]), 3), TypeError, r"expected an optimizer"),
    (lambda: StepLR(O(["0.1"]), 3), TypeError, r"param_groups\[0\]\['lr'\] must be a real number"),
    (lambda: StepLR(O([0.1]), 3, last_epoch=5), ValueError,
     r"StepLR: last_epoch=5 is not supported: .* call load_state_dict"),
])
def test_invalid_arguments_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


def _seq_case(kind):
    opt = FakeOptimizer([0.1])
    a, b = LinearLR(opt, total_iters=3), StepLR(opt, 2)
    return {
        "empty": lambda: SequentialLR(opt, [], []),
        "other optimizer": lambda: SequentialLR(opt, [a, StepLR(FakeOptimizer([1.0]), 2)], [3]),
        "not a scheduler": lambda: SequentialLR(opt, [a, "cosine"], [3]),
        "nested": lambda: SequentialLR(opt, [a, SequentialLR(opt, [b], [])], [3]),
        "milestone count": lambda: SequentialLR(opt, [a, b], [3, 6]),
        "not increasing": lambda: SequentialLR(opt, [a, b, CosineAnnealingLR(opt, 4)], [3, 3]),
        "zero milestone": lambda: SequentialLR(opt, [a, b], [0]),
        "twice": lambda: SequentialLR(opt, [a, a], [3]),
        "last_epoch": lambda: SequentialLR(opt, [a, b], [3], last_epoch=2),
        "plateau": lambda: SequentialLR(opt, [a, lr_scheduler.ReduceLROnPlateau(opt)], [3]),
    }[kind]


@pytest.mark.parametrize("kind, error, match", [
    ("empty", ValueError, r"SequentialLR: expects at least one scheduler"),
    ("other optimizer", ValueError, r"schedulers\[1\] \(StepLR\) belongs to another optimizer"),
    ("not a scheduler", TypeError, r"schedulers\[1\] must be an LRScheduler .*got str"),
    ("nested", TypeError, r"other than SequentialLR and ChainedScheduler, got SequentialLR"),
    ("milestone count", ValueError, r"one milestone fewer than schedulers, got 2 schedulers and "
                                    r"milestones \[3, 6\]"),
    ("not increasing", ValueError, r"milestones must be strictly increasing, got \[3, 3\]"),
    ("zero milestone", ValueError, r"milestones\[0\] must be an integer >= 1, got 0"),
    ("twice", ValueError, r"schedulers\[1\] is listed twice"),
    ("last_epoch", ValueError, r"SequentialLR: last_epoch=2 is not supported"),
    # PyTorch's check: it was accepted, then the step at the milestone raised AttributeError
    ("plateau", ValueError, r"schedulers\[1\] is a ReduceLROnPlateau, which needs the metric"),
])
def test_invalid_sequential_lr_is_refused(kind, error, match):
    make = _seq_case(kind)
    with pytest.raises(error, match=match):
        make()


# ------------------------------------------------------------------------ load_state_dict
def test_load_state_dict_refuses_bad_state_and_changes_nothing():
    opt = FakeOptimizer([0.1])
    sched = StepLR(opt, 3, gamma=0.5)
    sched.step()
    before = sched.state_dict()
    cos = CosineAnnealingLR(FakeOptimizer([0.1]), 5).state_dict()
    cases = [
        (cos, KeyError, r"missing keys \['step_size', 'gamma'\], unknown keys \['T_max', "
                        r"'eta_min'\] \(a state dict of another scheduler class\?\)"),
        ({**before, "gamma": -1.0}, ValueError,
         r"StepLR.load_state_dict: gamma must be finite and in \(0, inf\), got -1.0"),
        ({**before, "base_lrs": [0.1, 0.2]}, ValueError,
         r"base_lrs must be a list of 1 numbers \(one per param group\)"),
        ({**before, "last_epoch": "3"}, ValueError, r"last_epoch must be an integer >= -1"),
        ({**before, "_is_initial": True}, ValueError, r"_is_initial must be False"),
        ([1, 2], TypeError, r"expected a dict"),
    ]
    for state, error, match in cases:
        with pytest.raises(error, match=match):
            sched.load_state_dict(state)
        assert sched.state_dict() == before


def test_a_sequential_lr_load_is_all_or_nothing():
    opt = FakeOptimizer([0.1])
    seq = SequentialLR(opt, [LinearLR(opt, 0.5, total_iters=2), StepLR(opt, 3)], milestones=[2])
    for _ in range(5):
        seq.step()
    before = seq.state_dict()
    good = json.loads(json.dumps(before))
    good["_schedulers"][0]["last_epoch"] = 0
    good["_schedulers"][1]["gamma"] = 0.0  # the second is bad: the first must not be loaded
    with pytest.raises(ValueError, match=r"SequentialLR.load_state_dict: _schedulers\[1\]: "
                                         r"StepLR.load_state_dict: gamma must be finite"):
        seq.load_state_dict(good)
    assert seq.state_dict() == before


def test_base_class_needs_get_lr():
    class NoRule(LRScheduler):
        pass
    with pytest.raises(NotImplementedError, match="NoRule must implement get_lr"):
        NoRule(FakeOptimizer([0.1]))


# ----------------------------------------------------------------------------- with nn.Graph
def _digits(steps, bs=16):
    d = load_digits()
    it = batches(d.x_train, d.y_train, bs, rng=np.random.default_rng(0), drop_last=True)
    return [next(it) for _ in range(steps)]


@pytest.mark.parametrize("kind", ["sgd", "adam", "adadelta"])
def test_a_new_lr_every_step_never_recompiles_and_trains_like_the_oracle(kind):
    """Warm-up then cosine: the lr changes at every step, the graph compiles once, and every
    step uses the lr of its step (the float64 oracle with the same lr sequence)."""
    mf.manual_seed(3)
    model = mlp((64, 32, 10))
    ref = [p.numpy().astype(np.float64) for p in model.parameters()]
    opt = {"sgd": lambda p: mf.optim.SGD(p, lr=0.2, momentum=0.9),
           "adam": lambda p: mf.optim.Adam(p, lr=2e-2),
           "adadelta": lambda p: mf.optim.Adadelta(p, lr=1.0)}[kind](model.parameters())
    sched = SequentialLR(opt, [LinearLR(opt, 0.1, total_iters=5),
                               CosineAnnealingLR(opt, T_max=15)], milestones=[5])
    graph = TrainGraph(model, opt)
    state = [np.zeros_like(p) for p in ref] if kind == "sgd" else \
        [(np.zeros_like(p), np.zeros_like(p)) for p in ref]
    lrs = []
    for t, (xb, yb) in enumerate(_digits(20), start=1):
        lr = opt.param_groups[0]["lr"]
        lrs.append(lr)
        loss = float(graph(xb, yb))
        ref_loss, grads = forward_backward(ref, xb.astype(np.float64), yb)
        if kind == "sgd":
            sgd_step(ref, grads, state, lr, 0.9)
        elif kind == "adam":
            adam_step(ref, grads, state, t, lr, 0.9, 0.999, 1e-8)
        else:
            adadelta_step(ref, grads, state, lr)
        assert loss == pytest.approx(ref_loss, rel=1e-4)
        sched.step()
    assert graph.compile_count == 1 and opt.version == 0
    assert len(set(lrs)) == 20 and lrs[0] == pytest.approx(0.1 * lrs[5])
    for p, r in zip(model.parameters(), ref):
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-3, atol=1e-5)


def _scaled_graph(lr=0.1):
    mf.manual_seed(0)
    model = mlp((64, 16, 10))
    opt = mf.optim.SGD(model.parameters(), lr=lr)
    graph = TrainGraph(model, opt)
    graph.set_grad_scaler(mf.amp.GradScaler(init_scale=1024.0))
    return model, opt, graph


def _batch(bad: bool):
    x, y = _digits(1)[0]
    x = x.copy()
    if bad:
        x[0, 0] = np.inf  # the loss and every gradient are non-finite: the scaler skips
    return x, y


def test_a_step_skipped_by_the_grad_scaler_does_not_advance_the_schedule():
    """The k-th applied update uses the schedule's k-th lr; a skipped step changes no weight and
    no scheduler; the optimizer counts both kinds of steps."""
    model, opt, graph = _scaled_graph()
    sched = StepLR(opt, step_size=1, gamma=0.5)
    pattern = [False, True, True, False, True, False, False]
    applied_lrs = []
    for bad in pattern:
        before = model[0].weight.numpy()
        lr = opt.param_groups[0]["lr"]
        graph(*_batch(bad))
        assert graph._grad_scaler.found_inf is bad
        assert np.array_equal(model[0].weight.numpy(), before) is bad
        if not bad:
            applied_lrs.append(lr)
        sched.step()
    assert applied_lrs == [0.1, 0.05, 0.025, 0.0125]
    assert sched.last_epoch == 4 and sched.get_last_lr() == [0.1 / 16]
    assert (opt.num_steps, opt.num_skipped_steps) == (7, 3)
    assert graph.compile_count == 1


class _ScheduledGraph(nn.Graph):
    """OneFlow's form: the scheduler given to ``add_optimizer`` steps after every call."""

    def __init__(self, model, opt, sched):
        super().__init__()
        self.model = model
        self.add_optimizer(opt, lr_sch=sched)

    def build(self, x, y):
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


@pytest.mark.parametrize("accumulate", [1, 2])
def test_add_optimizer_lr_sch_steps_the_schedule_after_every_update(accumulate):
    """``add_optimizer(opt, lr_sch=sched)`` (OneFlow's ``nn.Graph``) gives the weights and lrs of
    calling ``sched.step()`` after each call, bit for bit, skipped steps included (one step per
    call with gradient accumulation: one update)."""
    runs = []
    for graph_steps in (False, True):
        model, opt, graph = _scaled_graph()
        sched = SequentialLR(opt, [LinearLR(opt, 0.25, total_iters=3),
                                   CosineAnnealingLR(opt, T_max=6)], milestones=[3])
        if graph_steps:
            graph = _ScheduledGraph(model, opt, sched)
            graph.set_grad_scaler(mf.amp.GradScaler(init_scale=1024.0))
            assert graph.lr_schedulers == (sched,)
        graph.config.set_gradient_accumulation_steps(accumulate)
        lrs = []
        for bad in [False, True, False, False, True, False, False, False]:
            lrs.append(opt.param_groups[0]["lr"])
            graph(*_batch(bad))
            if not graph_steps:
                sched.step()
        runs.append((lrs, sched.state_dict(), [p.numpy() for p in model.parameters()]))
    (lrs, state, weights), (lrs2, state2, weights2) = runs
    assert lrs == lrs2 and state == state2 and state["last_epoch"] == 6
    assert lrs[1] == lrs[2] != lrs[3] and lrs[4] == lrs[5] != lrs[6]   # held over the skips
    for a, b in zip(weights, weights2):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kwargs", [dict(T_0=3), dict(T_0=2, T_mult=2, eta_min=0.001)])
def test_cosine_annealing_warm_restarts_as_pytorchs(kwargs):
    """CosineAnnealingWarmRestarts (torch.optim.lr_scheduler's) was an AttributeError: cosine
    cycles of T_0, T_0 * T_mult ... epochs from the base lr to eta_min (the closed form), T_cur
    and T_i in the state dict, which loads both ways; a state saved after a fractional
    step(epoch) is refused."""
    opt = FakeOptimizer([0.1, 0.02])
    sched = CosineAnnealingWarmRestarts(opt, **kwargs)
    got = cfg.lr_sequence(sched, steps=20)
    t_0, mult, lo = kwargs["T_0"], kwargs.get("T_mult", 1), kwargs.get("eta_min", 0.0)
    expected, start, length = [], 0, t_0
    for e in range(21):
        if e - start == length:
            start, length = e, length * mult
        expected.append([lo + (b - lo) * (1 + math.cos(math.pi * (e - start) / length)) / 2
                         for b in (0.1, 0.02)])
    assert_lrs_equal(got, expected)
    assert (sched.T_cur, sched.T_i) == (20 - start, length)
    with pytest.raises(ValueError, match="T_0 must be an integer >= 1"):
        CosineAnnealingWarmRestarts(FakeOptimizer([0.1]), 0)
    with pytest.raises(ValueError, match=r"T_cur 2.5 and T_i .* do not follow from last_epoch"):
        CosineAnnealingWarmRestarts(FakeOptimizer([0.1, 0.02]), **kwargs).load_state_dict(
            {**sched.state_dict(), "T_cur": 2.5})
    torch = pytest.importorskip("torch")
    import make_lr_schedules as make
    topt = make.torch_optimizer([0.1, 0.02])
    theirs = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(topt, **kwargs)
    assert_lrs_equal(cfg.lr_sequence(theirs, topt.step, 20), got)
    mine = CosineAnnealingWarmRestarts(FakeOptimizer([0.1, 0.02]), **kwargs)
    mine.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(sched.state_dict())
    assert_lrs_equal(cfg.lr_sequence(mine, steps=9), cfg.lr_sequence(theirs, topt.step, 9))


@pytest.mark.parametrize("name,match", [
    ("OneCycleLR", "cycles the momentum .* LambdaLR of the step, or a SequentialLR"),
    ("CyclicLR", "cycles the momentum"), ("_LRScheduler", "subclass LRScheduler"),
    ("NoSuchLR", "has no attribute 'NoSuchLR'$")])
def test_schedulers_miniflow_has_not_say_why_and_what_to_write(name, match):
    """lr_scheduler.OneCycleLR was a bare AttributeError: the names PyTorch has and miniflow
    has not say why and what to write instead."""
    with pytest.raises(AttributeError, match=match):
        getattr(lr_scheduler, name)
    assert not hasattr(lr_scheduler, name)


def _chain(module, opt):
    return module.ChainedScheduler([module.ConstantLR(opt, 0.1, total_iters=2),
                                    module.ExponentialLR(opt, 0.9)])


def test_chained_scheduler_steps_each_in_turn_as_pytorchs():
    """ChainedScheduler (torch.optim.lr_scheduler's) was an AttributeError: each step steps its
    schedulers in order (a warm-up factor times a decay here); PyTorch's state-dict keys, loaded
    both ways mid-schedule; given to a graph as lr_sch, the lrs and weights of stepping it by hand
    (a step the grad scaler skipped held by each scheduler) and its schedulers refuse a step by
    hand; bad chains refused as PyTorch's."""
    opt = FakeOptimizer([0.1, 0.05])
    chain = _chain(lr_scheduler, opt)
    got = cfg.lr_sequence(chain, steps=6)
    assert_lrs_equal(got, [[b * (0.1 if e < 2 else 1.0) * 0.9 ** e for b in (0.1, 0.05)]
                           for e in range(7)])
    assert set(chain.state_dict()) == {"_last_lr", "_schedulers"}
    again = _chain(lr_scheduler, FakeOptimizer([0.1, 0.05]))
    again.load_state_dict(chain.state_dict())
    assert again.get_last_lr() == got[-1] and again._schedulers[1].last_epoch == 6
    one = FakeOptimizer([0.1])
    for make, error, match in [
            (lambda: ChainedScheduler([]), ValueError, "expects at least one scheduler"),
            (lambda: ChainedScheduler([ReduceLROnPlateau(one)]), ValueError, "ReduceLROnPlateau"),
            (lambda: ChainedScheduler([StepLR(one, 1), StepLR(FakeOptimizer([0.1]), 1)]),
             ValueError, r"schedulers\[1\] \(StepLR\) belongs to another optimizer"),
            (lambda: SequentialLR(one, [StepLR(one, 1), _chain(lr_scheduler, one)], [2]),
             TypeError, "other than SequentialLR and ChainedScheduler")]:
        with pytest.raises(error, match=match):
            make()
    with pytest.raises(KeyError, match="unknown keys"):
        again.load_state_dict({**chain.state_dict(), "last_epoch": 3})
    runs = []
    for graph_steps in (False, True):
        model, opt, graph = _scaled_graph()
        chain = _chain(lr_scheduler, opt)
        if graph_steps:
            graph = _ScheduledGraph(model, opt, chain)
            graph.set_grad_scaler(mf.amp.GradScaler(init_scale=1024.0))
            with pytest.raises(RuntimeError, match="was given to nn.Graph"):
                chain._schedulers[0].step()
        lrs = []
        for bad in [False, True, False, False]:
            lrs.append(opt.param_groups[0]["lr"])
            graph(*_batch(bad))             # the scaler skips the second: held
            if not graph_steps:
                chain.step()
        runs.append((lrs, [p.numpy() for p in model.parameters()]))
    assert_lrs_equal(runs[0][0], [0.01, 0.009, 0.009, 0.081])
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)
    torch = pytest.importorskip("torch")
    import make_lr_schedules as make
    topt = make.torch_optimizer([0.1, 0.05])
    theirs, ours = _chain(torch.optim.lr_scheduler, topt), _chain(lr_scheduler,
                                                                  FakeOptimizer([0.1, 0.05]))
    assert_lrs_equal(cfg.lr_sequence(ours, steps=3), cfg.lr_sequence(theirs, topt.step, 3))
    mine = _chain(lr_scheduler, FakeOptimizer([0.1, 0.05]))
    for g, lr in zip(mine.optimizer.param_groups, ours.get_last_lr()):
        g["lr"] = lr                     # as the optimizer's load_state_dict sets it
    mine.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    assert_lrs_equal(cfg.lr_sequence(mine, steps=3), cfg.lr_sequence(theirs, topt.step, 3))
    seqs = []                            # a SequentialLR in a chain, as PyTorch's takes it
    for module, o in ((lr_scheduler, FakeOptimizer([0.1])), (torch.optim.lr_scheduler,
                                                             make.torch_optimizer([0.1]))):
        warm = module.SequentialLR(o, [module.ConstantLR(o, 0.5, total_iters=2),
                                       module.StepLR(o, 2, 0.5)], [2])
        seqs.append(cfg.lr_sequence(module.ChainedScheduler([warm, module.ExponentialLR(o, 0.9)]),
                                    getattr(o, "step", lambda: None), 8))
    assert_lrs_equal(*seqs)


def test_add_optimizer_refuses_a_scheduler_it_cannot_step():
    model = mlp((4, 2))
    opt, other = (mf.optim.SGD(model.parameters(), lr=0.1) for _ in range(2))
    graph = nn.Graph()
    for kwargs, error, match in (
            (dict(lr_sch=StepLR(other, 1)), ValueError, "lr_sch schedules another optimizer"),
            (dict(lr_sch=lr_scheduler.ReduceLROnPlateau(opt)), ValueError,
             r"needs the metric .* step\(metric\) yourself"),
            (dict(lr_sch=lambda: None), TypeError, "lr_sch must be a miniflow.optim"),
            (dict(is_sparse=True), ValueError, "is_sparse=True .* not supported")):
        with pytest.raises(error, match=match):
            graph.add_optimizer(opt, **kwargs)
    assert graph.optimizers == () and graph.lr_schedulers == ()    # nothing was added


def test_a_per_epoch_schedule_advances_unless_the_whole_epoch_was_skipped():
    _, opt, graph = _scaled_graph()
    sched = StepLR(opt, step_size=1, gamma=0.5)
    for epoch in ([True, False, True], [True, True], [False]):
        for bad in epoch:
            graph(*_batch(bad))
        sched.step()
    assert sched.last_epoch == 2  # the second epoch skipped every step
    sched.step()                  # no graph call since: a plain step
    assert sched.last_epoch == 3


def test_the_skipped_step_rule_survives_a_checkpoint(tmp_path):
    """The optimizer's step counts and the scheduler's record of them are in their state
    dicts: after a resume, a skipped step still does not advance the schedule."""
    _, opt, graph = _scaled_graph()
    sched = CosineAnnealingLR(opt, T_max=10)
    for bad in (False, True, False):
        graph(*_batch(bad))
        sched.step()
    save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, tmp_path / "c.st")
    assert opt.state_dict()["num_skipped_steps"] == 1
    _, opt2, graph2 = _scaled_graph()
    sched2 = CosineAnnealingLR(opt2, T_max=10)
    ckpt = load(tmp_path / "c.st")
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    assert (opt2.num_steps, opt2.num_skipped_steps) == (3, 1)
    assert sched2.state_dict() == sched.state_dict()
    for g, s in ((graph, sched), (graph2, sched2)):
        g(*_batch(True))
        s.step()
    assert sched2.last_epoch == sched.last_epoch == 2
    assert sched2.get_last_lr() == sched.get_last_lr() == [opt2.param_groups[0]["lr"]]
    bad = dict(ckpt["scheduler"], _optimizer_steps_seen=[1, 2])
    with pytest.raises(ValueError, match=r"_optimizer_steps_seen has more skipped steps than "
                                         r"steps: \[1, 2\]"):
        sched2.load_state_dict(bad)
    bad_opt = dict(ckpt["optimizer"], num_steps=-1)
    with pytest.raises(ValueError, match=r"SGD.load_state_dict: num_steps must be an integer "
                                         r">= 0, got -1"):
        opt2.load_state_dict(bad_opt)


# ----------------------------------------------------------------------- ReduceLROnPlateau
# PyTorch's test/optim/test_lrscheduler.py (test_reduce_lr_on_plateau1..4): a metric sequence
# and the lr expected after each step (their targets, written out: no torch needed).
PLATEAU_CASES = {
    "min-abs-cooldown": (dict(threshold_mode="abs", mode="min", threshold=0.01, patience=5,
                              cooldown=5), [10 - i * 0.0167 for i in range(20)], [0.5] * 20),
    "min-abs": (dict(patience=5, cooldown=0, threshold_mode="abs", mode="min", threshold=0.1),
                [10 - i * 0.0165 for i in range(20)], [0.5] * 6 + [0.05] * 7 + [0.005] * 7),
    "max-abs-cooldown": (dict(mode="max", patience=5, cooldown=5, threshold_mode="abs"),
                         [-0.8] * 2 + [-0.234] * 20, [0.5] * 8 + [0.05] * 11 + [0.005] * 3),
    "max-rel": (dict(mode="max", patience=3, threshold_mode="rel", threshold=0.1),
                [1.5 * (1.025 ** i) for i in range(20)], [0.5] * 20),
}


def _plateau_run(opt, metrics, **kwargs):
    sched = lr_scheduler.ReduceLROnPlateau(opt, **kwargs)
    lrs = []
    for m in metrics:
        sched.step(m)
        lrs.append(sched.get_last_lr())
    return sched, lrs


@pytest.mark.parametrize("name", list(PLATEAU_CASES))
def test_reduce_lr_on_plateau_gives_pytorchs_targets(name):
    kwargs, metrics, targets = PLATEAU_CASES[name]
    _, lrs = _plateau_run(sgd(0.5), metrics, **kwargs)
    np.testing.assert_allclose([lr[0] for lr in lrs], targets, rtol=1e-12)


@pytest.mark.parametrize("kwargs", [dict(), dict(mode="max", factor=0.5, patience=2),
                                    dict(patience=1, cooldown=2, min_lr=[0.02, 0.001]),
                                    dict(patience=0, threshold=0.05, eps=1e-3, factor=0.7,
                                         min_lr=0.004)])
def test_reduce_lr_on_plateau_follows_live_pytorch_and_its_state_dict_loads(kwargs):
    torch = pytest.importorskip("torch")
    metrics = list(np.random.default_rng(4).uniform(0.0, 1.0, 60))
    opt = FakeOptimizer([0.1, 0.05])
    sched, lrs = _plateau_run(opt, metrics, **kwargs)
    t_opt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr}
                             for lr in (0.1, 0.05)])
    t_sched = torch.optim.lr_scheduler.ReduceLROnPlateau(t_opt, **kwargs)
    t_lrs = []
    for m in metrics:
        t_sched.step(m)
        t_lrs.append(t_sched.get_last_lr())
    np.testing.assert_allclose(lrs, t_lrs, rtol=1e-12)
    assert len(set(map(tuple, lrs))) > 1 or not kwargs       # the lr did change
    mine, theirs = sched.state_dict(), t_sched.state_dict()
    _assert_same_state(mine, theirs)
    fresh = lr_scheduler.ReduceLROnPlateau(FakeOptimizer(lrs[-1]), **kwargs)  # (lr: optimizer's)
    fresh.load_state_dict(theirs)                              # PyTorch's state loads
    _assert_same_state(fresh.state_dict(), mine)
    t_sched.load_state_dict(mine)                              # and miniflow's into PyTorch
    for m in metrics[:20]:
        t_sched.step(m)
        fresh.step(m)
    assert fresh.get_last_lr() == pytest.approx(t_sched.get_last_lr(), rel=1e-12)


def _assert_same_state(a: dict, b: dict):
    assert set(a) == set(b)
    for k in a:
        assert a[k] == (b[k] if isinstance(b[k], (str, type(None)))
                        else pytest.approx(b[k], rel=1e-12)), k


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(factor=1.0), ValueError, "Factor should be < 1.0"),
    (dict(mode="mean"), ValueError, r"mode must be one of \['min', 'max'\], got 'mean'"),
    (dict(threshold_mode="pct"), ValueError, "threshold_mode must be one of"),
    (dict(patience=-1), ValueError, "patience must be an integer >= 0"),
    (dict(min_lr=[0.1, 0.2]), ValueError, "expected 1 min_lrs"),
    (dict(eps="small"), TypeError, "eps must be a real number")])
def test_reduce_lr_on_plateau_refuses_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        lr_scheduler.ReduceLROnPlateau(sgd(), **kwargs)


def test_reduce_lr_on_plateau_steps_on_a_tensor_metric_and_refuses_nan():
    opt = sgd(0.5)
    sched = lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    sched.step(mf.tensor(np.array(2.0, np.float32)))
    sched.step(mf.tensor(np.array(3.0, np.float32)))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05) and opt.version == 0
    before = sched.state_dict()
    with pytest.raises(ValueError, match="metrics must be finite, got nan"):
        sched.step(float("nan"))
    with pytest.raises(TypeError, match="metrics must be a number"):
        sched.step([1.0, 2.0])
    with pytest.raises(TypeError, match="metrics must be a number"):
        sched.step(mf.tensor(np.array([1.0, 2.0], np.float32)))
    assert sched.state_dict() == before
    bad = dict(before, num_bad_epochs=-1)
    with pytest.raises(ValueError, match="num_bad_epochs must be an integer >= 0"):
        sched.load_state_dict(bad)
    with pytest.raises(KeyError, match=r"unknown keys \['verbose'\]"):
        sched.load_state_dict(dict(before, verbose=True))
    assert sched.state_dict() == before


@pytest.mark.parametrize("metric", [mf.tensor(np.array([4.0], np.float32)),
                                    np.array([[4.0]]), np.float32(4.0)])
def test_reduce_lr_on_plateau_takes_a_one_element_metric_of_any_shape(metric):
    """A ``[1]`` tensor (a loss a graph returns with ``keepdim``, or a mean of the accumulated
    micro-batch losses kept 1-D) is a metric, as ``float()`` of it is in PyTorch; before, its
    ``numpy()`` went through ``float()``, which NumPy 2 refuses for a 1-D array ("only
    0-dimensional arrays can be converted"), and the message asked for a one-element tensor."""
    opt = sgd(0.5)
    sched = lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    sched.step(3.0)
    sched.step(metric)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05) and sched.best == 3.0
    torch = pytest.importorskip("torch")
    topt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)
    tsched = torch.optim.lr_scheduler.ReduceLROnPlateau(topt, patience=0)
    tsched.step(3.0)
    tsched.step(torch.tensor([4.0]))
    assert topt.param_groups[0]["lr"] == pytest.approx(0.05)
