"""DistributedSampler: PyTorch's sharding semantics (checked against PyTorch when it is installed,
for the unshuffled order and the shard sizes and padding), disjoint shards covering the data,
determinism per (seed, epoch), and ``batches(..., sampler=)``."""
import numpy as np
import pytest

import miniflow
from miniflow import distributed as dist
from miniflow.data import DistributedSampler, batches

CASES = [(n, k, drop) for n in (0, 1, 2, 5, 10, 11, 17, 64) for k in (1, 2, 3, 4, 7)
         for drop in (False, True)]


def shards(n, k, **kw):
    return [DistributedSampler(np.zeros(n), num_replicas=k, rank=r, **kw).indices()
            for r in range(k)]


@pytest.mark.parametrize("n, k, drop_last", CASES)
@pytest.mark.parametrize("shuffle", [False, True])
def test_shards_are_equal_and_cover_the_epoch(n, k, drop_last, shuffle):
    parts = shards(n, k, shuffle=shuffle, drop_last=drop_last, seed=3)
    sizes = {len(p) for p in parts}
    assert len(sizes) == 1                                     # every rank the same count
    size = sizes.pop()
    assert all(p.dtype == np.int64 for p in parts)
    assert size == len(DistributedSampler(np.zeros(n), num_replicas=k, rank=0, drop_last=drop_last))
    # interleaving the shards back (position i of rank r is epoch position i * k + r) gives the
    # epoch order: a permutation of 0..n-1, padded from its start or cut at its tail
    order = np.empty(size * k, np.int64)
    for r, p in enumerate(parts):
        order[r::k] = p
    perm = np.random.default_rng(3).permutation(n) if shuffle else np.arange(n)
    if drop_last:
        assert size * k == n - n % k
        np.testing.assert_array_equal(order, perm[:size * k])
        assert len(set(order.tolist())) == len(order)        # disjoint shards
    else:
        assert size * k == -(-n // k) * k
        np.testing.assert_array_equal(order, np.resize(perm, size * k))
        assert set(order.tolist()) == set(range(n))           # the union is the data set
        assert len(set(order.tolist())) == min(n, len(order))  # repeats are the padding only


def test_epochs_and_seeds():
    s = DistributedSampler(np.zeros(100), num_replicas=2, rank=1, seed=7)
    first = s.indices()
    np.testing.assert_array_equal(first, s.indices())                  # deterministic
    np.testing.assert_array_equal(list(s), first.tolist())             # __iter__ = indices()
    s.set_epoch(1)
    assert s.epoch == 1 and not np.array_equal(first, s.indices())
    again = DistributedSampler(np.zeros(100), num_replicas=2, rank=1, seed=7)
    again.set_epoch(1)
    np.testing.assert_array_equal(again.indices(), s.indices())        # per (seed, epoch)
    # seed + epoch is the generator's seed, as in PyTorch
    other = DistributedSampler(np.zeros(100), num_replicas=2, rank=1, seed=8)
    np.testing.assert_array_equal(other.indices(), s.indices())
    assert not np.array_equal(DistributedSampler(np.zeros(100), 2, 1, seed=9).indices(), first)


def test_two_ranks_of_32_are_one_rank_of_64():
    """The data order of issue 15's acceptance test: the global batch k of two ranks with batch
    32 holds the rows of batch k of one rank with batch 64 over the same epoch order."""
    x = np.arange(300, dtype=np.float32)[:, None]
    y = np.arange(300)
    one = DistributedSampler(x, num_replicas=1, rank=0, seed=5)
    two = [DistributedSampler(x, num_replicas=2, rank=r, seed=5) for r in range(2)]
    for epoch in range(3):
        for s in [one, *two]:
            s.set_epoch(epoch)
        big = list(batches(x, y, 64, sampler=one, drop_last=True))
        small = [list(batches(x, y, 32, sampler=s, drop_last=True)) for s in two]
        assert len(big) == len(small[0]) == len(small[1]) == 4
        for (xb, yb), (x0, y0), (x1, y1) in zip(big, *small):
            assert sorted(yb.tolist()) == sorted(y0.tolist() + y1.tolist())
            np.testing.assert_array_equal(xb[:, 0], yb)


def test_batches_with_a_sampler():
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    y = np.arange(5)
    s = DistributedSampler(x, num_replicas=2, rank=1, shuffle=False)      # indices 1, 3, 0
    got = list(batches(x, y, 2, sampler=s))
    assert [yb.tolist() for _, yb in got] == [[1, 3], [0]]
    np.testing.assert_array_equal(got[0][0], x[[1, 3]])
    assert [yb.tolist() for _, yb in batches(x, y, 2, sampler=s, drop_last=True)] == [[1, 3]]
    assert [yb.tolist() for _, yb in batches(x, y, 2, shuffle=False, sampler=s)] == [[1, 3], [0]]


def test_batches_default_still_shuffles_with_the_global_generator():
    x, y = np.zeros((20, 1), np.float32), np.arange(20)
    miniflow.manual_seed(4)
    default = np.concatenate([yb for _, yb in batches(x, y, 6)])
    miniflow.manual_seed(4)
    explicit = np.concatenate([yb for _, yb in batches(x, y, 6, shuffle=True)])
    np.testing.assert_array_equal(default, explicit)
    assert not np.array_equal(default, y)


@pytest.mark.parametrize("kw, match", [
    ({"shuffle": True}, r"batches: pass a sampler or shuffle=True/rng, not both"),
    ({"rng": np.random.default_rng(0)}, r"batches: pass a sampler or shuffle=True/rng, not both"),
])
def test_batches_rejects_a_sampler_with_shuffling(kw, match):
    x, y = np.zeros((4, 1)), np.arange(4)
    with pytest.raises(ValueError, match=match):
        list(batches(x, y, 2, sampler=DistributedSampler(x, 1, 0), **kw))


def test_batches_rejects_a_sampler_of_another_data_set():
    x, y = np.zeros((4, 1)), np.arange(4)
    s = DistributedSampler(np.zeros(10), 1, 0, shuffle=False)
    with pytest.raises(ValueError, match=r"the sampler gave row indices in \[0, 9\] but x has 4 "
                                         r"rows; make the sampler for this data set"):
        list(batches(x, y, 2, sampler=s))


@pytest.mark.parametrize("kw, error, match", [
    ({"num_replicas": 2, "rank": 2}, ValueError,
     r"^Invalid rank 2, rank should be in the interval \[0, 1\]$"),
    ({"num_replicas": 2, "rank": -1}, ValueError, r"Invalid rank -1, rank should be in the interval"),
    ({"num_replicas": 0, "rank": 0}, ValueError, r"num_replicas must be an integer >= 1, got 0"),
    ({"num_replicas": 2.0, "rank": 0}, ValueError, r"num_replicas must be an integer >= 1, got 2.0"),
    ({"num_replicas": 2, "rank": 0, "seed": -1}, ValueError, r"seed must be an integer >= 0, got -1"),
    ({"num_replicas": 2, "rank": True}, ValueError, r"Invalid rank True"),
])
def test_bad_arguments(kw, error, match):
    with pytest.raises(error, match=match):
        DistributedSampler(np.zeros(4), **kw)


def test_bad_dataset_and_epoch():
    with pytest.raises(TypeError, match=r"DistributedSampler: dataset must have a length \(len\(\)\), "
                                        r"got a int"):
        DistributedSampler(10, 1, 0)
    s = DistributedSampler(np.zeros(4), 1, 0)
    for epoch in (-1, 1.5, None):
        with pytest.raises(ValueError, match=rf"set_epoch: epoch must be an integer >= 0, got {epoch}"):
            s.set_epoch(epoch)


def test_data_set_that_changed_length():
    data = list(range(5))
    s = DistributedSampler(data, 2, 0)
    data.append(5)
    with pytest.raises(RuntimeError, match=r"the data set had 5 rows when the sampler was made "
                                           r"and has 6 now"):
        s.indices()


def test_defaults_come_from_the_world(monkeypatch):
    monkeypatch.setitem(dist._STATE, "world", None)
    with pytest.raises(RuntimeError, match=r"distributed\.world_size: .*init\(\) first"):
        DistributedSampler(np.zeros(4))
    for var in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    dist.init()
    s = DistributedSampler(np.zeros(4))
    assert (s.num_replicas, s.rank) == (1, 0)


# ----------------------------------------------------------------------------- against PyTorch
@pytest.mark.parametrize("n, k, drop_last", CASES)
def test_matches_pytorch(n, k, drop_last):
    torch_dist = pytest.importorskip("torch.utils.data.distributed")
    for r in range(k):
        ours = DistributedSampler(np.zeros(n), num_replicas=k, rank=r, shuffle=False,
                                  drop_last=drop_last)
        theirs = torch_dist.DistributedSampler(range(n), num_replicas=k, rank=r, shuffle=False,
                                               drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)
        assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)
        # shuffled: another permutation, but the same sizes and the same amount of padding
        shuffled = DistributedSampler(np.zeros(n), num_replicas=k, rank=r, drop_last=drop_last)
        theirs = torch_dist.DistributedSampler(range(n), num_replicas=k, rank=r,
                                               drop_last=drop_last)
        assert len(list(shuffled)) == len(list(theirs)) == len(theirs)
    everyone = [list(torch_dist.DistributedSampler(range(n), num_replicas=k, rank=r,
                                                    drop_last=drop_last)) for r in range(k)]
    ours = [s.tolist() for s in shards(n, k, drop_last=drop_last)]
    assert len({i for p in everyone for i in p}) == len({i for p in ours for i in p})


@pytest.mark.parametrize("args,match", [
    ((np.zeros((4, 2)), np.zeros(4), 0), r"batch_size must be an int >= 1, got 0"),
    ((np.zeros((4, 2)), np.zeros(4), 2.5), r"batch_size must be an int >= 1, got 2.5"),
    ((np.zeros((4, 2)), np.zeros(4), None), r"batch_size must be an int >= 1, got None"),
    ((np.zeros((4, 2)), np.zeros(5), 2), r"x has 4 rows but y has 5"),
])
def test_batches_checks_its_arguments_when_called(args, match):
    """A new user's finding: the checks ran at the first ``next()``, far from the call (PyTorch's
    DataLoader(batch_size=0) raises when it is made); 2.5 and None were raw TypeErrors."""
    with pytest.raises(ValueError, match=match):
        batches(*args)


def test_batches_takes_lists():
    got = list(batches([[1.0], [2.0], [3.0]], [0, 1, 2], 2, shuffle=False))
    assert [b[1].tolist() for b in got] == [[0, 1], [2]]
