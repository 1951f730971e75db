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


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool = True,
            drop_last: bool = False, rng: np.random.Generator | None = None):
    """Yield ``(x_batch, y_batch)`` pairs covering the data once (one epoch).

    Shuffling uses ``rng`` or miniflow's global generator (``miniflow.manual_seed``).

    Raises:
        ValueError: batch_size < 1 or x and y of different lengths.
    """
    if batch_size < 1:
        raise ValueError(f"batches: batch_size must be >= 1, got {batch_size}")
    if len(x) != len(y):
        raise ValueError(f"batches: x has {len(x)} rows but y has {len(y)}")
    idx = (rng or generator()).permutation(len(x)) if shuffle else np.arange(len(x))
    stop = len(x) - (len(x) % batch_size if drop_last else 0)
    for i in range(0, stop, batch_size):
        j = idx[i:i + batch_size]
        yield np.ascontiguousarray(x[j]), np.ascontiguousarray(y[j])
