"""The losses of ``miniflow.nn.functional``: ``cross_entropy`` with ``label_smoothing``, following
PyTorch's ``torch.nn.functional.cross_entropy`` doc (target ``(1 - ε) onehot + ε / C``) and its
``test/test_nn.py`` label-smoothing tests (value and gradient against the smoothed-target
formula, every reduction): a NumPy float64 oracle, and PyTorch when it is installed. The
gradient is read from one SGD step of lr 1 on the logits in an nn.Graph."""
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
    eager = nn.functional.cross_entropy(mf.tensor(LOGITS), LABELS, reduction, label_smoothing=eps)
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


def _ops(eps) -> list:
    """The op names of the compiled training graph with label smoothing ``eps``."""
    model = nn.Module()
    model.logits = nn.Parameter(LOGITS.copy())
    step = _Step(model, eps, "mean")
    step(mf.tensor(LABELS))
    return [n.op.name for n in step.ir.nodes]
