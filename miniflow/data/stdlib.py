"""A text corpus every machine has: the source code of Python's own standard library, read at run
time (nothing is downloaded), for character-level language models (nanoGPT's
``shakespeare_char`` recipe on other text).

:data:`MODULES` is a fixed, sorted list of pure-Python standard-library modules (about 2.4 MB of
source on CPython 3.11); each is read from the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``, ``name.py`` or ``name/__init__.py``), so the text is fixed
for a given Python version. The files are joined in that order, each preceded by a
``# ---- name ----`` line; the first 90% of the characters are the training split, the rest the
validation split (nanoGPT's split). The vocabulary is the sorted set of characters of the whole
text.
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..random import generator

__all__ = ["MODULES", "StdlibText", "stdlib_text"]

MODULES = ("argparse", "ast", "base64", "bisect", "calendar", "codecs", "collections",
           "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib",
           "dis", "enum", "fnmatch", "fractions", "functools", "getopt", "gettext", "glob", "gzip",
           "heapq", "hmac", "inspect", "ipaddress", "json", "locale", "logging", "numbers",
           "operator", "optparse", "os", "pickle", "platform", "pprint", "queue", "random",
           "shlex", "shutil", "socket", "statistics", "string", "subprocess", "tarfile",
           "tempfile", "textwrap", "threading", "timeit", "tokenize", "traceback", "typing",
           "uuid", "warnings", "weakref", "zipfile")
"""The modules whose source makes the corpus, sorted (pure Python in every CPython 3.9+)."""

TRAIN_FRACTION = 0.9


@dataclass(frozen=True)
class StdlibText:
    """The corpus and its character vocabulary.

    Attributes:
        train, val: the two splits (str).
        chars: the vocabulary, sorted (a str; token id = position).
        modules: the modules read, in order.
    """

    train: str
    val: str
    chars: str
    modules: tuple

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """int64 token ids of ``text``.

        Raises:
            TypeError: ``text`` is not a str (bytes: decode them first).
            ValueError: a character outside the vocabulary, naming it and where."""
        if not isinstance(text, str):
            raise TypeError(f"stdlib_text.encode: text must be a str, got {type(text).__name__} "
                            f"{text!r:.40} (bytes: decode them first, text.decode('utf-8'))")
        points = np.frombuffer(text.encode("utf-32-le"), np.uint32).astype(np.int64)
        vocab = np.frombuffer(self.chars.encode("utf-32-le"), np.uint32).astype(np.int64)
        table = np.full(max(int(vocab.max(initial=0)), int(points.max(initial=0))) + 1, -1,
                        np.int64)
        table[vocab] = np.arange(vocab.size)
        ids = table[points]
        bad = np.flatnonzero(ids < 0)
        if bad.size:
            raise ValueError(f"stdlib_text.encode: character {text[bad[0]]!r} at position "
                             f"{bad[0]} is not in the vocabulary of {len(self.chars)} characters")
        return ids

    def decode(self, ids) -> str:
        """The text of token ids ``ids`` (any int array).

        Raises:
            ValueError: an id outside ``[0, vocab_size)``, naming the first."""
        flat = np.asarray(ids).reshape(-1)
        bad = [int(i) for i in flat if not 0 <= int(i) < len(self.chars)][:1]
        if bad:
            raise ValueError(f"stdlib_text.decode: token id {bad[0]} is outside the vocabulary "
                             f"[0, {len(self.chars)})")
        return "".join(self.chars[int(i)] for i in flat)

    def unigram_loss(self) -> float:
        """The validation cross-entropy (nats per character) of the unigram model: the
        training split's character frequencies, add-one smoothed so that no validation character
        has probability zero. The baseline a language model must beat."""
        counts = np.bincount(self.encode(self.train), minlength=self.vocab_size) + 1.0
        logp = np.log(counts / counts.sum())
        return float(-logp[self.encode(self.val)].mean())

    def batch(self, split: str, batch_size: int, block_size: int, rng=None) -> tuple:
        """``(x, y)``, int64 ``[batch_size, block_size]``: random windows of ``split``
        (``"train"`` or ``"val"``) and the same windows shifted by one character, the
        targets. Offsets from ``rng`` (default: miniflow's global generator, so
        ``miniflow.manual_seed`` makes them reproducible).

        Raises:
            ValueError: an unknown split, a batch_size or block_size that is not an int >= 1,
                or a block longer than the split."""
        if split not in ("train", "val"):
            raise ValueError(f"stdlib_text.batch: split must be 'train' or 'val', got {split!r}")
        for name, value in (("batch_size", batch_size), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"stdlib_text.batch: {name} must be an int >= 1, got {value!r}")
        data = self._ids(split)
        if block_size + 1 > data.size:
            raise ValueError(f"stdlib_text.batch: block_size {block_size} needs more than the "
                             f"{data.size} characters of the {split} split")
        rng = generator() if rng is None else rng
        start = rng.integers(0, data.size - block_size, batch_size)
        rows = start[:, None] + np.arange(block_size)
        return data[rows], data[rows + 1]

    def _ids(self, split: str) -> np.ndarray:
        cache = self.__dict__.setdefault("_cache", {})
        if split not in cache:
            cache[split] = self.encode(self.train if split == "train" else self.val)
        return cache[split]


def _source(root: Path, name: str) -> str:
    for path in (root / f"{name}.py", root / name / "__init__.py"):
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise FileNotFoundError(f"stdlib_text: the source of the standard-library module {name!r} "
                            f"is not in {root} (a Python without its .py sources, e.g. a "
                            f"stripped distribution package: install the full standard library)")


def stdlib_text(modules=MODULES) -> StdlibText:
    """The corpus of :data:`MODULES` (or the given module names), split and with its vocabulary
    (see the module docstring).

    Raises:
        FileNotFoundError: a module's source is not in this interpreter's standard library.
        TypeError: ``modules`` is one str, not a sequence of names (it would be read letter by
            letter)."""
    if isinstance(modules, str):
        raise TypeError(f"stdlib_text: modules must be a sequence of module names, got the str "
                        f"{modules!r} (pass ({modules!r},))")
    root = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(f"# ---- {name} ----\n{_source(root, name)}" for name in modules)
    cut = int(len(text) * TRAIN_FRACTION)
    return StdlibText(train=text[:cut], val=text[cut:], chars="".join(sorted(set(text))),
                      modules=tuple(modules))
