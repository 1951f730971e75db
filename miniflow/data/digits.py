"""The handwritten digits data set bundled with scikit-learn (UCI optdigits test set): 1,797 8x8
grey images, 10 classes. Nothing is downloaded.

Pixels are scaled to [0, 1] (divided by 16). The train/test split is fixed: a stratified split with
``random_state=0`` giving 1,437 training and 360 test images.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..random import generator

__all__ = ["Digits", "load_digits", "batches"]

TEST_SIZE = 360


@dataclass
class Digits:
    """x_*: f32[n, 64] in [0, 1]; y_*: i64[n] in [0, 10)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int = 10


def load_digits() -> Digits:
    """Load the digits with the fixed 1,437 / 360 split."""
    from sklearn.datasets import load_digits as _load
    from sklearn.model_selection import train_test_split

    d = _load()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=TEST_SIZE, random_state=0, stratify=y)
    return Digits(np.ascontiguousarray(x_tr), y_tr, np.ascontiguousarray(x_te), y_te)


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool | None = None,
            drop_last: bool = False, rng: np.random.Generator | None = None, sampler=None):
    """An iterator of ``(x_batch, y_batch)`` pairs covering the data once (one epoch).

    Shuffling (``shuffle``, default True) uses ``rng`` or miniflow's global generator
    (``miniflow.manual_seed``). With a ``sampler`` (a :class:`DistributedSampler`, or anything
    whose ``indices()`` returns row indices) the batches cover the sampler's indices in its order
    instead, this rank's shard of the epoch; the sampler then does the shuffling.

    The arguments are checked, and the epoch's order drawn, when ``batches`` is called (as
    PyTorch's ``DataLoader`` checks them when it is made), not at the first ``next``: the
    batches themselves are a generator.

    Raises:
        ValueError: batch_size not an int >= 1, x and y of different lengths, a sampler
            together with ``shuffle=True`` or ``rng``, or a sampler index outside
            ``[0, len(x))``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ValueError(f"batches: batch_size must be an int >= 1, got {batch_size!r}")
    x, y = np.asarray(x), np.asarray(y)
    if len(x) != len(y):
        raise ValueError(f"batches: x has {len(x)} rows but y has {len(y)}")
    if sampler is not None:
        if shuffle or rng is not None:
            raise ValueError("batches: pass a sampler or shuffle=True/rng, not both: the sampler "
                             "shuffles (DistributedSampler(..., shuffle=True, seed=...))")
        idx = np.asarray(sampler.indices())
        if idx.size and not 0 <= idx.min() <= idx.max() < len(x):
            raise ValueError(f"batches: the sampler gave row indices in [{idx.min()}, "
                             f"{idx.max()}] but x has {len(x)} rows; make the sampler for this "
                             f"data set")
    elif shuffle is None or shuffle:
        idx = (rng or generator()).permutation(len(x))
    else:
        idx = np.arange(len(x))
    stop = len(idx) - (len(idx) % batch_size if drop_last else 0)
    return _batches(x, y, idx, stop, int(batch_size))


def _batches(x, y, idx, stop: int, batch_size: int):
    """The generator :func:`batches` returns: rows ``idx[i:i + batch_size]`` up to ``stop``."""
    for i in range(0, stop, batch_size):
        j = idx[i:i + batch_size]
        yield np.ascontiguousarray(x[j]), np.ascontiguousarray(y[j])
