"""Data: scikit-learn's bundled handwritten digits, seeded batching, the distributed sampler, and
the source of Python's standard library as a character-level text corpus (``stdlib_text``)."""
from .digits import Digits, batches, load_digits
from .sampler import DistributedSampler
from .stdlib import StdlibText, stdlib_text

__all__ = ["Digits", "DistributedSampler", "StdlibText", "batches", "load_digits", "stdlib_text"]
