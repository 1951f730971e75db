"""``miniflow.data.stdlib_text``: the standard library's source as a corpus, read at run time:
the same text and split every call, the 90/10 split of nanoGPT's character recipe, an exact
encode/decode round trip, batches whose targets are the inputs shifted by one, the unigram
baseline against a direct count, and clear errors."""
import numpy as np
import pytest

import miniflow as mf
from miniflow.data import stdlib_text
from miniflow.data.stdlib import MODULES


@pytest.fixture(scope="module")
def corpus():
    return stdlib_text()


def test_corpus_is_deterministic_sorted_and_split_90_10(corpus):
    assert list(MODULES) == sorted(MODULES) and corpus.modules == MODULES
    again = stdlib_text()
    assert again.train == corpus.train and again.val == corpus.val
    total = len(corpus.train) + len(corpus.val)
    assert total > 1_000_000 and len(corpus.train) == int(total * 0.9)
    assert corpus.train.startswith("# ---- argparse ----\n")
    assert corpus.chars == "".join(sorted(set(corpus.train + corpus.val)))


def test_encode_decode_round_trip_and_batches(corpus):
    text = corpus.val[:5000]
    ids = corpus.encode(text)
    assert ids.dtype == np.int64 and corpus.decode(ids) == text
    mf.manual_seed(3)
    x, y = corpus.batch("train", 4, 32)
    mf.manual_seed(3)
    x2, _ = corpus.batch("train", 4, 32)
    np.testing.assert_array_equal(x, x2)
    assert x.shape == y.shape == (4, 32)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    for row in corpus.decode(x[0]), corpus.decode(y[0]):
        assert row in corpus.train


def test_unigram_baseline_is_the_smoothed_frequency_cross_entropy(corpus):
    counts = {c: 1 for c in corpus.chars}
    for c in corpus.train:
        counts[c] += 1
    total = sum(counts.values())
    sample = corpus.val[::97]
    want = -np.mean([np.log(counts[c] / total) for c in sample])
    idx = np.arange(0, len(corpus.val), 97)
    ids = corpus.encode(corpus.val)[idx]
    freq = (np.bincount(corpus.encode(corpus.train), minlength=corpus.vocab_size) + 1.0)
    got = float(-np.log(freq / freq.sum())[ids].mean())
    assert got == pytest.approx(want, rel=1e-12)
    assert 2.5 < corpus.unigram_loss() < 4.0


def test_errors_name_the_problem(corpus):
    with pytest.raises(ValueError, match="character '\u4e2d' at position 1 is not in the "
                                         "vocabulary"):
        corpus.encode("x\u4e2d")
    with pytest.raises(ValueError, match="split must be 'train' or 'val'"):
        corpus.batch("test", 1, 8)
    with pytest.raises(FileNotFoundError, match="standard-library module 'no_such_module'"):
        stdlib_text(("no_such_module",))
    # a new user's edges: these were an empty batch, NumPy errors, or a silent wrap-around
    for args in ((2, -3), (-1, 8), (2, 0), (2.5, 8)):
        with pytest.raises(ValueError, match=r"stdlib_text.batch: (batch|block)_size must be an "
                                             r"int >= 1"):
            corpus.batch("train", *args)
    for ids in ([-1, 0], [10 ** 6]):
        with pytest.raises(ValueError, match=r"token id -?\d+ is outside the vocabulary"):
            corpus.decode(ids)
    with pytest.raises(TypeError, match=r"modules must be a sequence of module names, got the "
                                        r"str 'this'"):
        stdlib_text("this")


def test_encode_of_no_str_names_the_type(corpus):
    """``encode(b"def ")`` (bytes read from a file) was "'bytes' object has no attribute
    'encode'", ``encode(None)`` "'NoneType' ..."; both name the type and the way to a str."""
    for text, name in ((b"def ", "bytes"), (None, "NoneType"), (["d"], "list")):
        with pytest.raises(TypeError, match=rf"stdlib_text.encode: text must be a str, got "
                                            rf"{name}"):
            corpus.encode(text)
