"""Data: scikit-learn's bundled handwritten digits and seeded batching."""
from .digits import Digits, batches, load_digits

__all__ = ["Digits", "batches", "load_digits"]
