"""Data: scikit-learn's bundled handwritten digits, seeded batching and the distributed sampler."""
from .digits import Digits, batches, load_digits
from .sampler import DistributedSampler

__all__ = ["Digits", "DistributedSampler", "batches", "load_digits"]
