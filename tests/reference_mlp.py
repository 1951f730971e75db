"""An independent NumPy float64 implementation of the digits MLP step (forward, backward,
SGD/Adam/Adadelta), written from the textbook formulas, used as the oracle for miniflow's training
tests."""
import numpy as np


def forward_backward(params, x, y):
    """params: [w1 (h,in), b1 (h,), w2 (c,h), b2 (c,)]; returns loss and grads (same order)."""
    w1, b1, w2, b2 = params
    h_pre = x @ w1.T + b1
    h = np.maximum(h_pre, 0)
    z = h @ w2.T + b2
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y]).mean()
    dz = p.copy()
    dz[np.arange(n), y] -= 1
    dz /= n
    dw2 = dz.T @ h
    db2 = dz.sum(0)
    dh = dz @ w2 * (h_pre > 0)
    dw1 = dh.T @ x
    db1 = dh.sum(0)
    return loss, [dw1, db1, dw2, db2]


def sgd_step(params, grads, bufs, lr, momentum, wd=0.0):
    for p, g, b in zip(params, grads, bufs):
        g = g + wd * p
        b *= momentum
        b += g
        p -= lr * b


def adam_step(params, grads, state, t, lr, b1, b2, eps, wd=0.0):
    for p, g, (m, v) in zip(params, grads, state):
        g = g + wd * p
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * g * g
        p -= lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)


def adadelta_step(params, grads, state, lr, rho=0.9, eps=1e-6, wd=0.0, maximize=False):
    """Zeiler 2012's Adadelta as ``torch.optim.Adadelta``'s documentation writes it (``state``:
    one ``(square_avg, acc_delta)`` pair per parameter, updated in place)."""
    for p, g, (v, u) in zip(params, grads, state):
        g = -g if maximize else g
        g = g + wd * p
        v *= rho
        v += (1 - rho) * g * g
        dx = np.sqrt(u + eps) / np.sqrt(v + eps) * g
        u *= rho
        u += (1 - rho) * dx * dx
        p -= lr * dx
