"""Which rows of a data set each rank trains on: PyTorch's ``DistributedSampler``."""
from __future__ import annotations

import math
import numpy as np

from ..checks import integer, is_integer
from .. import distributed

__all__ = ["DistributedSampler"]


class DistributedSampler:
    """This rank's shard of a data set's row indices, a new one every epoch: the semantics of
    ``torch.utils.data.distributed.DistributedSampler``.

    Every epoch the indices ``0 .. len(dataset) - 1`` are shuffled (``shuffle``) with a generator
    seeded by ``seed + epoch``, the same on every rank; without ``drop_last`` they are padded by
    repeating indices from the start until their count divides evenly by ``num_replicas``, with
    ``drop_last`` the tail is dropped instead; rank ``r`` takes every ``num_replicas``-th index
    from position ``r``. So every rank gets ``len(self)`` indices, the shards are disjoint apart
    from the padding, and together they cover the data set (without ``drop_last``).

    One difference from PyTorch: its shuffle is ``torch.randperm`` under a ``torch.Generator``,
    which NumPy cannot reproduce; miniflow's is ``numpy.random.default_rng(seed + epoch)
    .permutation(n)``. The order is a different permutation (deterministic per seed and epoch,
    identical on every rank of one NumPy version); shard sizes, padding, dropping and the
    unshuffled order are PyTorch's exactly.

    Use it with :func:`miniflow.data.batches` (``batches(x, y, 32, sampler=sampler)``), or take
    :meth:`indices` directly; call :meth:`set_epoch` before every epoch, or every epoch repeats
    epoch 0's order.

    Args:
        dataset: anything with ``len()``: the data set, e.g. its input array (rows = samples).
        num_replicas: the number of ranks (default :func:`miniflow.distributed.world_size`).
        rank: this rank (default :func:`miniflow.distributed.rank`).
        shuffle: shuffle the indices every epoch (default True).
        seed: the shuffle's seed, the same on every rank (an integer >= 0: NumPy's generators take
            no negative seeds, unlike PyTorch's).
        drop_last: drop the tail instead of padding (default False).

    Raises:
        TypeError: ``dataset`` has no ``len()``.
        ValueError: ``num_replicas`` < 1, ``rank`` outside ``[0, num_replicas - 1]`` (PyTorch's
            message), or ``seed`` not an integer >= 0.
        RuntimeError: ``num_replicas`` or ``rank`` left out before ``miniflow.distributed.init()``.
    """

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        try:
            n = len(dataset)
        except TypeError as e:
            raise TypeError(f"DistributedSampler: dataset must have a length (len()), got a "
                            f"{type(dataset).__name__}") from e
        if num_replicas is None:
            num_replicas = distributed.world_size()
        if rank is None:
            rank = distributed.rank()
        num_replicas = integer("DistributedSampler", "num_replicas", num_replicas, 1)
        if not is_integer(rank) or not 0 <= rank < num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = int(rank)
        self.shuffle = bool(shuffle)
        self.seed = integer("DistributedSampler", "seed", seed, 0)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._n = n
        if self.drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from now on (an integer >= 0).

        Raises:
            ValueError: ``epoch`` is not an integer >= 0.
        """
        self.epoch = integer("DistributedSampler.set_epoch", "epoch", epoch, 0)

    def indices(self) -> np.ndarray:
        """This rank's row indices for the current epoch: int64 ``[len(self)]``.

        Raises:
            RuntimeError: the data set's length changed since the sampler was made.
        """
        if len(self.dataset) != self._n:
            raise RuntimeError(f"DistributedSampler: the data set had {self._n} rows when the "
                               f"sampler was made and has {len(self.dataset)} now; make a new "
                               f"sampler")
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(self._n)
        else:
            order = np.arange(self._n)
        order = order[:self.total_size] if self.drop_last else np.resize(order, self.total_size)
        return order[self.rank:self.total_size:self.num_replicas].astype(np.int64, copy=False)

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples
