"""The losses of ``miniflow.nn.functional``: ``cross_entropy`` with ``label_smoothing``, following
PyTorch's ``torch.nn.functional.cross_entropy`` doc (target ``(1 - ε) onehot + ε / C``) and its
``test/test_nn.py`` label-smoothing tests (value and gradient against the smoothed-target
formula, every reduction): a NumPy float64 oracle, and PyTorch when it is installed. The
gradient is read from one SGD step of lr 1 on the logits in an nn.Graph."""
from functools import partial

import numpy as np
import pytest

import miniflow as mf
from miniflow import nn

R = np.random.default_rng(8)
LOGITS = (R.standard_normal((6, 5)) * 3).astype(np.float32)
LABELS = np.array([0, 4, 2, 2, 1, 3], np.int64)


def _oracle(eps: float, reduction: str):
    """Loss and d(loss)/d(logits) in float64 from the smoothed target."""
    x = LOGITS.astype(np.float64)
    logp = x - x.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    target = (1 - eps) * np.eye(x.shape[1])[LABELS] + eps / x.shape[1]
    per = -(target * logp).sum(1)
    grad = np.exp(logp) - target
    if reduction == "none":
        return per, grad
    return (per.mean(), grad / len(x)) if reduction == "mean" else (per.sum(), grad)


class _Step(nn.Graph):
    def __init__(self, model, eps, reduction):
        super().__init__()
        self.model, self.eps, self.reduction = model, eps, reduction
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=1.0))

    def build(self, y):
        loss = nn.functional.cross_entropy(self.model.logits, y, reduction=self.reduction,
                                           label_smoothing=self.eps)
        (loss.sum() if self.reduction == "none" else loss).backward()
        return loss


def _miniflow(eps, reduction):
    model = nn.Module()
    model.logits = nn.Parameter(LOGITS.copy())
    loss = _Step(model, eps, reduction)(mf.tensor(LABELS))
    return loss.numpy(), LOGITS - model.logits.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.7, 1.0])
def test_label_smoothing_loss_and_gradient_match_the_float64_oracle(eps, reduction):
    loss, grad = _miniflow(eps, reduction)
    want_loss, want_grad = _oracle(eps, reduction)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    eager = nn.functional.cross_entropy(mf.tensor(LOGITS), LABELS, reduction=reduction,
                                        label_smoothing=eps)
    np.testing.assert_allclose(eager.numpy(), want_loss, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_label_smoothing_matches_torch(reduction):
    torch = pytest.importorskip("torch")
    x = torch.tensor(LOGITS, requires_grad=True)
    want = torch.nn.functional.cross_entropy(x, torch.tensor(LABELS), reduction=reduction,
                                             label_smoothing=0.2)
    want.sum().backward()
    loss, grad = _miniflow(0.2, reduction)
    np.testing.assert_allclose(loss, want.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_no_smoothing_builds_the_plain_graph_and_bad_values_are_refused():
    assert "log_softmax" not in _ops(0.0) and "log_softmax" in _ops(0.1)
    for bad in (-0.1, 1.5, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="label_smoothing must be a number between 0.0 and "
                                             "1.0"):
            nn.functional.cross_entropy(mf.tensor(LOGITS), LABELS, label_smoothing=bad)


def test_label_smoothing_over_no_class_is_the_label_error():
    """Logits of no class with ``label_smoothing`` inside ``build`` were a bare
    ZeroDivisionError (eps / C) at trace time: every label is out of range, and the op's
    ValueError says so when the graph runs, as without smoothing and eagerly (PyTorch's
    IndexError "Target 0 is out of bounds")."""
    logits = mf.tensor(np.zeros((2, 0), np.float32))
    for eps in (0.0, 0.1):
        loss = partial(nn.functional.cross_entropy, target=[0, 0], label_smoothing=eps)
        for call in (loss, mf.compile(loss)):
            with pytest.raises(ValueError, match=r"label out of range \[0, num_classes\)"):
                call(logits)


def _ops(eps) -> list:
    """The op names of the compiled training graph with label smoothing ``eps``."""
    model = nn.Module()
    model.logits = nn.Parameter(LOGITS.copy())
    step = _Step(model, eps, "mean")
    step(mf.tensor(LABELS))
    return [n.op.name for n in step.ir.nodes]


# ------------------------------------------------------------------------------ ignore_index
IGNORED = np.array([0, -100, 2, -100, 1, 3], np.int64)


def _ignore_oracle(labels, ignore_index, eps, reduction):
    """PyTorch's ``ignore_index`` in float64 (``torch.nn.functional.cross_entropy`` doc): the
    rows whose label is ``ignore_index`` add no loss and get no gradient; "mean" divides by the
    number of the other rows."""
    x = LOGITS.astype(np.float64)
    keep = labels != ignore_index
    logp = x - x.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    target = (1 - eps) * np.eye(x.shape[1])[np.where(keep, labels, 0)] + eps / x.shape[1]
    per = np.where(keep, -(target * logp).sum(1), 0.0)
    grad = (np.exp(logp) - target) * keep[:, None]
    if reduction == "none":
        return per, grad
    if reduction == "sum":
        return per.sum(), grad
    with np.errstate(invalid="ignore", divide="ignore"):
        return per.sum() / keep.sum(), grad / keep.sum()


class _IgnoreStep(nn.Graph):
    def __init__(self, model, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=1.0))

    def build(self, y):
        loss = self.loss_fn(self.model.logits, y)
        (loss.sum() if loss.ndim else loss).backward()
        return loss


def _ignore_run(labels, loss_fn):
    model = nn.Module()
    model.logits = nn.Parameter(LOGITS.copy())
    loss = _IgnoreStep(model, loss_fn)(mf.tensor(labels))
    return loss.numpy(), LOGITS - model.logits.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_ignore_index_loss_and_gradient_match_the_float64_oracle(ignore_index, eps, reduction):
    """``ignore_index`` as PyTorch's ``cross_entropy`` (its doc; ``test_nn.py``'s
    ``test_cross_entropy_loss_ignore_index`` cases): ignored rows add neither loss nor
    gradient, "mean" is over the kept rows; label smoothing too; an index inside [0, C)."""
    labels = IGNORED if ignore_index == -100 else np.where(IGNORED == -100, 4, IGNORED)
    loss, grad = _ignore_run(labels, lambda x, y: nn.functional.cross_entropy(
        x, y, reduction=reduction, label_smoothing=eps, ignore_index=ignore_index))
    want_loss, want_grad = _ignore_oracle(labels, ignore_index, eps, reduction)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    assert not grad[labels == ignore_index].any()
    eager = nn.functional.cross_entropy(mf.tensor(LOGITS), labels,
                                        reduction=reduction, label_smoothing=eps,
                                        ignore_index=ignore_index)
    np.testing.assert_allclose(eager.numpy(), want_loss, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_loss_module_with_ignore_index_matches_torch(reduction):
    """``nn.CrossEntropyLoss(ignore_index=-1)`` (nanoGPT's ``ignore_index=-1``) against
    ``torch.nn.CrossEntropyLoss``: the loss and the logits' gradient."""
    torch = pytest.importorskip("torch")
    labels = np.where(IGNORED == -100, -1, IGNORED)
    x = torch.tensor(LOGITS, requires_grad=True)
    want = torch.nn.CrossEntropyLoss(ignore_index=-1, reduction=reduction,
                                     label_smoothing=0.1)(x, torch.tensor(labels))
    want.sum().backward()
    loss_fn = nn.CrossEntropyLoss(ignore_index=-1, reduction=reduction, label_smoothing=0.1)
    loss, grad = _ignore_run(labels, loss_fn)
    np.testing.assert_allclose(loss, want.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(grad, x.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_every_row_ignored_gives_nan_mean_zero_sum_and_no_gradient_as_torch():
    """PyTorch: a "mean" over no kept row is 0 / 0 = nan, a "sum" 0, and no gradient."""
    every = np.full(6, -100, np.int64)
    loss, grad = _ignore_run(every, lambda x, y: nn.functional.cross_entropy(
        x, y, reduction="sum", ignore_index=-100))
    assert loss == 0.0 and not grad.any()
    mean = nn.functional.cross_entropy(mf.tensor(LOGITS), every, ignore_index=-100)
    assert np.isnan(mean.numpy())
    torch = pytest.importorskip("torch")
    assert torch.isnan(torch.nn.functional.cross_entropy(torch.tensor(LOGITS),
                                                         torch.tensor(every)))


EMPTY_LOSSES = {
    "cross_entropy": lambda F, x, t, y, w: F.cross_entropy(x, t),
    "cross_entropy_ignore": lambda F, x, t, y, w: F.cross_entropy(x, t, ignore_index=-100),
    "cross_entropy_smoothing": lambda F, x, t, y, w: F.cross_entropy(x, t, label_smoothing=0.1),
    "cross_entropy_weight": lambda F, x, t, y, w: F.cross_entropy(x, t, weight=w),
    "nll_loss": lambda F, x, t, y, w: F.nll_loss(x, t),
    "mse_loss": lambda F, x, t, y, w: F.mse_loss(x, y),
    "l1_loss": lambda F, x, t, y, w: F.l1_loss(x, y),
    "binary_cross_entropy_with_logits":
        lambda F, x, t, y, w: F.binary_cross_entropy_with_logits(x, y),
    "kl_div": lambda F, x, t, y, w: F.kl_div(x, y, reduction="mean"),
    "kl_div_batchmean": lambda F, x, t, y, w: F.kl_div(x, y, reduction="batchmean"),
    "mean": lambda F, x, t, y, w: x.mean(),
    "mean0": lambda F, x, t, y, w: x.mean(0).sum(),
}
"""Mean-reduced losses of a batch of 0 rows: ``(functional, logits, labels, targets, class
weights) -> loss`` (miniflow's or torch's functional)."""


class _EmptyStep(nn.Graph):
    """A linear layer on a static batch of 0 rows, one SGD step of lr 1 (momentum, no weight
    decay): the parameters move by their gradient."""

    def __init__(self, fn, amp=False):
        super().__init__()
        mf.manual_seed(0)
        self.fc, self.fn = nn.Linear(3, 5), fn
        self.add_optimizer(mf.optim.SGD(self.fc.parameters(), lr=1.0, momentum=0.9))
        if amp:
            self.config.enable_amp(True, dtype=mf.float16)

    def build(self, x, t, y):
        loss = self.fn(nn.functional, self.fc(x), t, y, np.ones(5, np.float32))
        loss.backward()
        return loss


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides:UserWarning")   # torch's kl_div
@pytest.mark.parametrize("name", sorted(EMPTY_LOSSES))
def test_the_mean_of_an_empty_batch_is_nan_with_zero_parameter_gradients_as_torch(name):
    """An empty batch with reduction "mean" was refused (cross_entropy: "the batch is empty";
    the others: "mean: dims [0, 1] of shape [0, 5] hold no element"); PyTorch's loss is nan
    (the mean of nothing) and its parameters' gradients are zeros (the gradient of 0 rows):
    eagerly, and in build (float32 and under AMP) one SGD step leaves the parameters as they
    were, no NaN in them; reduction "sum" is 0."""
    fn = EMPTY_LOSSES[name]
    x, t, y = (np.zeros((0, 3), np.float32), np.zeros(0, np.int64),
               np.zeros((0, 5), np.float32))
    assert np.isnan(fn(nn.functional, mf.tensor(np.zeros((0, 5), np.float32)), mf.tensor(t),
                       mf.tensor(y), np.ones(5, np.float32)).numpy())
    for amp in (False, True):
        step = _EmptyStep(fn, amp)
        before = [p.numpy().copy() for p in step.fc.parameters()]
        assert np.isnan(step(mf.tensor(x), mf.tensor(t), mf.tensor(y)).numpy())
        for b, p in zip(before, step.fc.parameters()):
            np.testing.assert_array_equal(p.numpy(), b)
    assert nn.functional.cross_entropy(mf.tensor(y), t, reduction="sum").numpy() == 0.0
    torch = pytest.importorskip("torch")
    fc = torch.nn.Linear(3, 5)
    loss = fn(torch.nn.functional, fc(torch.zeros(0, 3)), torch.zeros(0, dtype=torch.long),
              torch.zeros(0, 5), torch.ones(5))
    loss.backward()
    assert torch.isnan(loss) and not fc.weight.grad.any() and not fc.bias.grad.any()


def test_a_label_of_minus_100_without_ignore_index_says_how_to_ignore_it():
    with pytest.raises(ValueError, match=r"label\[1\] = -100 .*only with ignore_index=-100"):
        _ignore_run(IGNORED, lambda x, y: nn.functional.cross_entropy(x, y))
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        nn.CrossEntropyLoss(ignore_index=1.5)
    with pytest.raises(ValueError, match="reduction must be"):
        nn.CrossEntropyLoss(reduction="avg")


class _MSEStep(nn.Graph):
    """mse_loss of a parameter against a target: one SGD step of lr 1 shows the gradient."""

    def __init__(self, x, reduction):
        super().__init__()
        self.m = nn.Module()
        self.m.x = nn.Parameter(x)
        self.loss, self.reduction = nn.MSELoss(reduction=reduction), reduction
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

    def build(self, target):
        loss = self.loss(self.m.x, target)
        (loss.sum() if self.reduction == "none" else loss).backward()
        return loss


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_and_its_gradient_match_the_float64_oracle_and_torch(reduction):
    """mse_loss / MSELoss: the loss and d(loss)/d(input) = 2 (input - target) (/ n for "mean"),
    against NumPy float64 and ``torch.nn.functional.mse_loss`` when installed."""
    x, t = LOGITS, LOGITS[::-1].copy() * 0.5
    d = x.astype(np.float64) - t
    want = {"mean": (d * d).mean(), "sum": (d * d).sum(), "none": d * d}[reduction]
    want_grad = 2 * d / (d.size if reduction == "mean" else 1)
    step = _MSEStep(x, reduction)
    np.testing.assert_allclose(step(t).numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(x - step.m.x.numpy(), want_grad, rtol=1e-4, atol=1e-5)
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.mse_loss(torch.tensor(x), torch.tensor(t), reduction=reduction)
    got = nn.functional.mse_loss(mf.tensor(x), t, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-6)


@pytest.mark.parametrize("fn, module", [("mse_loss", nn.MSELoss), ("l1_loss", nn.L1Loss)])
def test_elementwise_losses_refuse_what_pytorch_would_silently_broadcast_or_promote(fn, module):
    x, loss = mf.tensor(LOGITS), getattr(nn.functional, fn)
    with pytest.raises(ValueError, match=fr"{fn}: target size \[6, 1\] is different from "
                                         r"the input size \[6, 5\] \(PyTorch would broadcast"):
        loss(x, np.zeros((6, 1), np.float32))
    with pytest.raises(TypeError, match=fr"{fn}: input float32 and target float64 have "
                                        r"different dtypes"):
        loss(x, mf.tensor(LOGITS.astype(np.float64)))
    with pytest.raises(ValueError, match=fr"{fn}: reduction must be 'mean', 'sum' or "
                                         r"'none', got 'avg'"):
        module(reduction="avg")
    for positional in (lambda: loss(x, mf.tensor(LOGITS), "sum"), lambda: module(True)):
        with pytest.raises(ValueError, match=fr"{fn}: size_average and reduce are deprecated "
                                             r"in PyTorch and not supported; give reduction="):
            positional()                # PyTorch: size_average, its legacy rule makes a mean


# ------------------------------------------------------------------------------ nll_loss
def _nll_oracle(x, t, w, ignore_index, reduction):
    """``torch.nn.functional.nll_loss`` in NumPy float64: the loss and d(loss)/d(input)."""
    x, classes = x.astype(np.float64), x.shape[1 if x.ndim > 1 else 0]
    rows = np.moveaxis(x.reshape((1,) * (x.ndim == 1) + x.shape), 1, -1).reshape(-1, classes)
    labels = np.asarray(t).reshape(-1)
    keep = labels != ignore_index
    safe = np.where(keep, labels, 0)
    wt = np.where(keep, np.asarray(w, np.float64)[safe], 0.0)
    at = np.arange(len(labels))
    per = np.where(keep, -wt * rows[at, safe], 0.0)
    grad = np.zeros_like(rows)
    grad[at, safe] = -wt
    if reduction == "mean":
        loss, grad = per.sum() / wt.sum(), grad / wt.sum()
    else:
        loss = per.sum() if reduction == "sum" else per.reshape(np.shape(t))
    shape = (1,) * (x.ndim == 1) + x.shape
    grad = np.moveaxis(grad.reshape(shape[:1] + shape[2:] + shape[1:2]), -1, 1).reshape(x.shape)
    return loss, grad


class _NLLStep(nn.Graph):
    """``nn.NLLLoss`` of a parameter (log probabilities) against a target given as a graph input
    (computed in the build: the in-graph range check); one SGD step of lr 1 shows the gradient."""

    def __init__(self, x, loss):
        super().__init__()
        self.m = nn.Module()
        self.m.x = nn.Parameter(x)
        self.loss = loss
        self.add_optimizer(mf.optim.SGD(self.m.parameters(), lr=1.0))

    def build(self, target):
        loss = self.loss(self.m.x, target)
        (loss.sum() if self.loss.reduction == "none" else loss).backward()
        return loss


def _nll_case(shape, seed=3):
    r = np.random.default_rng(seed)
    x = r.standard_normal(shape).astype(np.float32)
    classes = shape[1] if len(shape) > 1 else shape[0]
    t_shape = shape[:1] + shape[2:] if len(shape) > 1 else ()
    t = r.integers(0, classes, t_shape).astype(np.int64)
    if t.size > 2:
        t.reshape(-1)[[1, -1]] = -100         # two ignored elements
    w = r.uniform(0.5, 2.0, classes).astype(np.float32)
    return x, t, w


@pytest.mark.parametrize("shape", [(6, 5), (5,), (2, 4, 3, 2)])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_and_gradient_match_the_float64_oracle_and_torch(shape, weighted, reduction):
    """nll_loss / NLLLoss for [N, C], unbatched [C] and [N, C, d1, d2] inputs, with and without
    class weights, targets -100 ignored (the default ignore_index): loss and gradient of one
    graph step against NumPy float64, the eager loss against ``torch.nn.functional.nll_loss``."""
    x, t, w = _nll_case(shape)
    want, want_grad = _nll_oracle(x, t, w if weighted else np.ones_like(w), -100, reduction)
    step = _NLLStep(x, nn.NLLLoss(w if weighted else None, reduction=reduction))
    np.testing.assert_allclose(step(t).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x - step.m.x.numpy(), want_grad, rtol=1e-5, atol=1e-6)
    eager = nn.functional.nll_loss(mf.tensor(x), t, mf.tensor(w) if weighted else None,
                                   reduction=reduction)
    np.testing.assert_allclose(eager.numpy(), want, rtol=1e-5, atol=1e-6)
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.nll_loss(xt, torch.tensor(t), torch.tensor(w) if weighted else None,
                                       reduction=reduction)
    (ref.sum() if reduction == "none" else ref).backward()
    assert eager.shape == tuple(ref.shape)
    np.testing.assert_allclose(eager.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(x - step.m.x.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_nll_loss_of_log_softmax_is_cross_entropy_and_ignore_index_is_any_int():
    """``nll_loss(log_softmax(x))`` is ``cross_entropy(x)`` (PyTorch's definition of it), also
    with another ``ignore_index`` (a label outside [0, C) is then fine where it is ignored), and
    with a ``weight`` it is PyTorch's weighted ``cross_entropy``."""
    x, t = LOGITS, LABELS.copy()
    t[2] = 7
    got = nn.functional.nll_loss(mf.tensor(x).log_softmax(1), t, ignore_index=7)
    want = nn.functional.cross_entropy(mf.tensor(x), t, ignore_index=7)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    torch = pytest.importorskip("torch")      # and with a weight, torch's weighted one
    w = np.linspace(0.5, 2.0, 5).astype(np.float32)
    got = nn.functional.nll_loss(mf.tensor(x).log_softmax(1), t, w, ignore_index=7)
    ref = torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor(t), torch.tensor(w),
                                            ignore_index=7)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-6)


def test_nll_loss_every_element_ignored_or_an_empty_batch_gives_nan_mean_as_torch():
    """Every target ignored: "mean" is 0 / 0 = nan, "sum" 0, no gradient (PyTorch's values); an
    empty batch: "mean" nan, "sum" 0, as PyTorch."""
    t = np.full(6, -100, np.int64)
    step = _NLLStep(LOGITS, nn.NLLLoss())
    assert np.isnan(step(t).numpy())
    np.testing.assert_array_equal(step.m.x.numpy(), LOGITS)
    assert nn.functional.nll_loss(mf.tensor(LOGITS), t, reduction="sum").numpy() == 0.0
    empty = mf.tensor(np.zeros((0, 5), np.float32))
    assert np.isnan(nn.functional.nll_loss(empty, np.zeros(0, np.int64)).numpy())
    assert nn.functional.nll_loss(empty, np.zeros(0, np.int64), reduction="sum").numpy() == 0.0


def test_nll_loss_module_keeps_its_weight_as_torch_in_the_state_dict():
    """``NLLLoss(weight)`` registers the weight as a buffer: ``weight`` in the state dict, as
    PyTorch's; without one the state dict is empty."""
    w = np.array([1.0, 2.0, 3.0], np.float32)
    assert list(nn.NLLLoss(w).state_dict()) == ["weight"]
    np.testing.assert_array_equal(nn.NLLLoss(w).state_dict()["weight"], w)
    assert list(nn.NLLLoss().state_dict()) == []
    torch = pytest.importorskip("torch")
    assert list(torch.nn.NLLLoss(torch.tensor(w)).state_dict()) == ["weight"]


def test_nll_loss_refuses_what_torch_refuses_with_its_messages():
    x = mf.tensor(LOGITS)          # [6, 5]
    cases = [
        (IndexError, r"nll_loss: Target 5 is out of bounds\.",
         lambda: nn.functional.nll_loss(x, np.array([0, 5, 1, 1, 1, 1]))),
        (IndexError, r"nll_loss: Target -1 is out of bounds\.",
         lambda: nn.functional.nll_loss(x, np.array([0, -1, 1, 1, 1, 1]))),
        (ValueError, r"nll_loss: Expected input batch_size \(6\) to match target batch_size "
                     r"\(2\)\.", lambda: nn.functional.nll_loss(x, np.array([0, 1]))),
        (ValueError, r"nll_loss: Expected target size \[2, 3\], got \[2, 4\]",
         lambda: nn.functional.nll_loss(mf.tensor(np.zeros((2, 5, 3), np.float32)),
                                        np.zeros((2, 4), np.int64))),
        (ValueError, r"nll_loss: For 1D input, 1D target must have size 1",
         lambda: nn.functional.nll_loss(mf.tensor(LOGITS[0]), np.array([1, 2]))),
        (ValueError, r"nll_loss: Expected 1 or more dimensions \(got 0\)",
         lambda: nn.functional.nll_loss(mf.tensor(np.float32(1.0)), np.array(0))),
        (ValueError, r"nll_loss: weight tensor should be defined either for all 5 classes or "
                     r"no classes but got weight tensor of shape: \[3\]",
         lambda: nn.functional.nll_loss(x, LABELS, weight=np.ones(3, np.float32))),
        (TypeError, r"nll_loss: input float32 and weight float64 have different dtypes",
         lambda: nn.functional.nll_loss(x, LABELS, weight=mf.tensor(np.ones(5)))),
        (RuntimeError, r"not differentiable with respect to argument 'weight'",
         lambda: nn.functional.nll_loss(x, LABELS, weight=nn.Parameter(np.ones(5, np.float32)))),
        (TypeError, r"nll_loss: expected target dtype to be Long \(int64\), but got float64",
         lambda: nn.functional.nll_loss(x, LABELS.astype(np.float64))),
        (TypeError, r"nll_loss: ignore_index must be an int, got 1\.5",
         lambda: nn.functional.nll_loss(x, LABELS, ignore_index=1.5)),
        (TypeError, r"nll_loss: input must be floating point",
         lambda: nn.functional.nll_loss(mf.tensor(LABELS), LABELS)),
        (ValueError, r"nll_loss: reduction must be 'mean', 'sum' or 'none', got 'avg'",
         lambda: nn.NLLLoss(reduction="avg")),
        (ValueError, r"nll_loss: size_average and reduce are deprecated",
         lambda: nn.functional.nll_loss(x, LABELS, None, True)),
    ]
    for error, message, call in cases:
        with pytest.raises(error, match=message):
            call()


def test_nll_loss_target_computed_in_the_graph_is_range_checked_when_it_runs():
    """A target given as a graph input has no value at build time: its out-of-range class is
    refused when the graph runs, by the ``gather`` of the class weights (naming the index; an
    IndexError, as PyTorch's)."""
    step = _NLLStep(LOGITS, nn.NLLLoss())
    with pytest.raises(IndexError, match=r"gather: index 5 at indices\[1\] is out of range "
                                         r"\[0, 5\)"):
        step(np.array([0, 5, 1, 1, 1, 1], np.int64))


# ------------------------------------------------------------------------------ l1_loss
class _L1Step(_MSEStep):
    def __init__(self, x, reduction):
        super().__init__(x, reduction)
        self.loss = nn.L1Loss(reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_l1_loss_and_its_gradient_match_the_float64_oracle_and_torch(reduction):
    """l1_loss / L1Loss: the loss and d(loss)/d(input) = sign(input - target) (/ n for "mean";
    0 where they are equal, as PyTorch), against NumPy float64 and ``torch``'s."""
    x, t = LOGITS, LOGITS[::-1].copy() * 0.5
    t[0, :2] = x[0, :2]                  # equal elements: gradient 0
    d = x.astype(np.float64) - t
    want = {"mean": np.abs(d).mean(), "sum": np.abs(d).sum(), "none": np.abs(d)}[reduction]
    want_grad = np.sign(d) / (d.size if reduction == "mean" else 1)
    step = _L1Step(x, reduction)
    np.testing.assert_allclose(step(t).numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(x - step.m.x.numpy(), want_grad, rtol=1e-4, atol=1e-7)
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.l1_loss(xt, torch.tensor(t), reduction=reduction)
    (ref.sum() if reduction == "none" else ref).backward()
    np.testing.assert_allclose(nn.functional.l1_loss(mf.tensor(x), t, reduction=reduction)
                               .numpy(), ref.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(x - step.m.x.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-7)


def test_l1_loss_refuses_the_deprecated_arguments_where_a_third_argument_lands_in_torch():
    """``l1_loss(x, t, "sum")`` is ``size_average="sum"`` in PyTorch (its legacy rule then
    averages): refused, naming the keyword to use."""
    with pytest.raises(ValueError, match=r"l1_loss: size_average and reduce are deprecated"):
        nn.functional.l1_loss(mf.tensor(LOGITS), LOGITS, "sum")
    with pytest.raises(ValueError, match=r"l1_loss: size_average and reduce are deprecated"):
        nn.L1Loss(reduce=False)


class _AmpStep(nn.Graph):
    """An MLP trained under AMP with ``nll_loss(log_softmax(logits))`` or ``cross_entropy``."""

    def __init__(self, model, nll):
        super().__init__()
        self.model, self.nll = model, nll
        self.add_optimizer(mf.optim.SGD(model.parameters(), lr=0.1))
        self.config.enable_amp(True)

    def build(self, x, y):
        out = self.model(x)
        loss = (nn.functional.nll_loss(out.log_softmax(1), y) if self.nll
                else nn.functional.cross_entropy(out, y))
        loss.backward()
        return loss


def test_nll_loss_of_log_softmax_trains_under_amp_as_cross_entropy():
    """Under AMP (float16 matmuls) the composed ``nll_loss`` traces and trains: 4 steps follow
    ``cross_entropy``'s losses to float16 rounding."""
    r = np.random.default_rng(0)
    x, y = r.standard_normal((32, 16)).astype(np.float32), r.integers(0, 10, 32)
    runs = []
    for nll in (True, False):
        mf.manual_seed(0)
        step = _AmpStep(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)), nll)
        runs.append([float(step(x, y).numpy()) for _ in range(4)])
    np.testing.assert_allclose(runs[0], runs[1], rtol=2e-3)
    assert runs[0][-1] < runs[0][0]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_takes_torch_positional_order_and_a_class_weight(reduction):
    """``cross_entropy(x, y, w)`` (PyTorch's third positional argument is ``weight``) was
    NumPy's "truth value of an array is ambiguous" for an array and "reduction must be ... got
    tensor(...)" for a tensor; it is the weighted loss, sum of ``-w[t] log p[t]`` divided by
    the kept rows' weights for "mean" (a NumPy float64 oracle), and the module takes it."""
    x, t = LOGITS.astype(np.float64), IGNORED
    w = np.linspace(0.5, 2.0, 5)
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    kept = t != -100
    per = np.where(kept, -w[np.where(kept, t, 0)] * logp[np.arange(len(t)), np.where(kept, t, 0)],
                   0.0)
    want = {"none": per, "sum": per.sum(), "mean": per.sum() / w[t[kept]].sum()}[reduction]
    for weight in (w.astype(np.float32), mf.tensor(w.astype(np.float32))):
        got = nn.functional.cross_entropy(mf.tensor(LOGITS), t, weight, None, -100, None,
                                          reduction)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    module = nn.CrossEntropyLoss(w.astype(np.float32), None, -100, None, reduction)
    np.testing.assert_allclose(module(mf.tensor(LOGITS), t).numpy(), want, rtol=1e-5, atol=1e-6)
    assert "weight" in module.state_dict()
    with pytest.raises(ValueError, match="cross_entropy: size_average and reduce are deprecated"):
        nn.functional.cross_entropy(mf.tensor(LOGITS), t, None, True)
    with pytest.raises(ValueError, match=r"cross_entropy: a class weight with "
                                         r"label_smoothing=0.1 is not supported"):
        nn.CrossEntropyLoss(w, label_smoothing=0.1)
    with pytest.raises(TypeError, match=r"cross_entropy: weight must be a \[C\] tensor of "
                                        r"class weights, got 'sum'.*give reduction='sum' by"):
        nn.functional.cross_entropy(mf.tensor(LOGITS), t, "sum")
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.cross_entropy(torch.tensor(LOGITS), torch.tensor(t),
                                            torch.tensor(w.astype(np.float32)),
                                            reduction=reduction)
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_and_l1_loss_take_pytorchs_weight(reduction):
    """PyTorch's sixth argument of mse_loss / l1_loss, ``weight`` (per element), was a
    TypeError: each element's loss times its weight, "mean" divided by the weights' sum
    (a NumPy float64 oracle, and torch's)."""
    x, y = LOGITS.astype(np.float64), np.roll(LOGITS, 1).astype(np.float64)
    w = np.linspace(0.1, 2.0, LOGITS.size).reshape(LOGITS.shape)
    for fn, per in ((nn.functional.mse_loss, (x - y) ** 2),
                    (nn.functional.l1_loss, np.abs(x - y))):
        want = {"none": per * w, "sum": (per * w).sum(), "mean": (per * w).sum() / w.sum()}
        got = fn(mf.tensor(LOGITS), np.roll(LOGITS, 1), None, None, reduction,
                 w.astype(np.float32))
        np.testing.assert_allclose(got.numpy(), want[reduction], rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match=r"Weights and input must have the same size. "
                                             r"\(weight \[5\], input \[6, 5\]\)"):
            fn(mf.tensor(LOGITS), LOGITS, weight=np.ones(5, np.float32))
        with pytest.raises(TypeError, match="input float32 and weight float64 have different"):
            fn(mf.tensor(LOGITS), LOGITS, weight=mf.tensor(w))
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.l1_loss(torch.tensor(LOGITS), torch.tensor(np.roll(LOGITS, 1)),
                                      reduction=reduction,
                                      weight=torch.tensor(w.astype(np.float32)))
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
