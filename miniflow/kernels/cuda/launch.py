"""Launch configuration of every CUDA kernel, in one place: block sizes, grid caps, the matmul tile.

Kernels come in four launch shapes, each with a helper that returns the builder's steps:

* ``flat_steps``: 1-D grid-stride loops over ``n`` elements (elementwise, casts, copies, updates);
  ``blocks = min(ceil(n / block), max_blocks)`` of ``block`` threads.
* ``row_steps``: one block of ``row_block`` threads per row (reductions, softmax family); the block
  strides over the row's columns and combines partial results in shared memory; at most
  ``max_row_blocks`` blocks, each looping over rows ``blockIdx.x, blockIdx.x + gridDim.x, ...``.
* ``grid_steps``: grid-wide reductions (``multi_count_not_finite``): ``reduce_grid(n)`` blocks of
  ``block`` threads, at most ``reduce_blocks``, striding over ``n`` elements; each block combines
  its threads' partial results in shared memory and writes one partial result per block, which a
  one-block kernel combines.
* ``tile_steps``: the matmul grid, ``(ceil(N / tile), ceil(M / tile))`` blocks of
  ``(tile / tile_reg)^2`` threads; each block computes one ``tile x tile`` output tile, each
  thread ``tile_reg x tile_reg`` of its outputs (register tiling).
* ``conv_tile_steps``: the convolutions' implicit GEMMs, ``(ceil(M / conv_tile), ceil(N /
  conv_tile), groups)`` blocks of ``conv_tile x conv_tile`` threads (one group per
  ``blockIdx.z``).

Two presets: ``GPU`` (real hardware) and ``SIMULATOR``. The CUDA simulator runs every thread as a
Python thread (about 0.1 ms per thread for simple kernels, up to ~2 ms with several
``syncthreads``), so its preset uses tiny blocks and grids; kernel code is the same, only these
numbers change. The preset is chosen at import (``NUMBA_ENABLE_CUDASIM``); builders read
``current()`` when a plan is built, and ``use_config`` switches it (tests run GPU-sized launches
in the simulator).

A step's ``fn`` is a :class:`Launch`: the kernel with its grid and block, called as ``fn(*args)``.
Empty launches (``n == 0``) produce no step.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

from numba import config as numba_config

__all__ = ["LaunchConfig", "GPU", "SIMULATOR", "MAX_BLOCK_THREADS",
           "MAX_ARRAYS", "chunks", "current", "use_config", "Launch", "flat_steps", "row_steps",
           "reduce_grid", "grid_steps", "tile_steps", "conv_tile_steps"]


@dataclass(frozen=True)
class LaunchConfig:
    """Launch numbers shared by all kernels.

    Attributes:
        name: ``"gpu"`` or ``"simulator"``.
        block: threads per block of 1-D grid-stride kernels.
        max_blocks: cap on the 1-D grid (threads beyond the data loop; more data strides).
        row_block: threads per block of row kernels; a power of two (tree reduction).
        max_row_blocks: cap on the number of row blocks.
        reduce_blocks: cap on the grid of grid-wide reductions (a few blocks per SM: enough
            to fill the GPU, few partial results to combine).
        tile: matmul block tile edge: a block computes a ``tile x tile`` tile of the product.
        tile_k: the K-slice of the operand tiles a block stages in shared memory at a time (two
            ``tile_k x (tile + 1)`` tiles: 8.3 KiB in f32 at 16 x 64).
        tile_reg: outputs per thread along each dim (``tile / tile_reg`` threads per dim).
        conv_tile: the convolutions' implicit-GEMM tile edge: ``conv_tile x conv_tile`` threads,
            one output each (``kernels.cuda.conv``).
    """

    name: str
    block: int
    max_blocks: int
    row_block: int
    max_row_blocks: int
    reduce_blocks: int
    tile: int
    tile_k: int
    tile_reg: int
    conv_tile: int

    def __post_init__(self):
        threads = (self.tile // self.tile_reg) ** 2
        if self.tile % self.tile_reg or (self.tile * self.tile_k) % threads:
            raise ValueError(f"LaunchConfig {self.name}: tile {self.tile} must be a multiple of "
                             f"tile_reg {self.tile_reg}, and tile * tile_k a multiple of the "
                             f"{threads} threads of a matmul block")


GPU = LaunchConfig("gpu", block=256, max_blocks=4096, row_block=128, max_row_blocks=65535,
                   reduce_blocks=1024, tile=64, tile_k=16, tile_reg=4, conv_tile=16)
"""Real hardware: 256-thread blocks, 128-thread row blocks, reductions over at most 1024 blocks
(about 8 per SM of a 132-SM GPU), 64 x 64 matmul tiles of 16 x 16 threads computing 4 x 4
outputs each, 16 x 16 convolution tiles."""
SIMULATOR = LaunchConfig("simulator", block=32, max_blocks=2, row_block=8, max_row_blocks=2,
                         reduce_blocks=2, tile=8, tile_k=4, tile_reg=2, conv_tile=4)
"""The CUDA simulator: at most 64 threads per 1-D launch, 8-thread rows, 8 x 8 matmul tiles of
4 x 4 threads, 4 x 4 convolution tiles."""

_CONFIG = [SIMULATOR if numba_config.ENABLE_CUDASIM else GPU]

MAX_BLOCK_THREADS = 1024
"""CUDA's limit on the threads of one block (every compute capability since 2.0)."""

MAX_ARRAYS = 64
"""Array arguments of one multi-tensor launch at most: numba-cuda passes an array as 56 bytes of
kernel parameters, and CUDA's limit is 4 KiB before compute capability 9.0 (64 x 56 bytes =
3.5 KiB); a larger group is split into several launches (:func:`chunks`)."""


def chunks(items: list, arrays_each: int) -> list:
    """``items`` (one per tensor of a multi-tensor launch, each passing ``arrays_each`` arrays)
    in runs of at most ``MAX_ARRAYS // arrays_each``."""
    n = max(1, MAX_ARRAYS // arrays_each)
    return [items[i:i + n] for i in range(0, len(items), n)]


def current() -> LaunchConfig:
    """The launch configuration builders use now."""
    return _CONFIG[0]


@contextlib.contextmanager
def use_config(cfg: LaunchConfig):
    """Build plans with ``cfg`` inside the ``with`` block (steps keep the config they got)."""
    old = _CONFIG[0]
    _CONFIG[0] = cfg
    try:
        yield cfg
    finally:
        _CONFIG[0] = old


class Launch:
    """A kernel bound to its launch: ``Launch(kernel, grid, block, name)(*args)`` runs
    ``kernel[grid, block](*args)``.

    ``kernel`` is a ``numba.cuda.jit`` dispatcher (``kernel.py_func`` is its Python source, which
    the PTX test compiles); ``name`` (also ``__name__``) labels it in plan listings and timings.
    The simulator's kernels keep their launch configuration in the kernel object itself, so under
    the simulator the configuration is applied at every call instead of once.
    """

    __slots__ = ("kernel", "grid", "block", "name", "_configured")

    def __init__(self, kernel, grid, block, name: str):
        """Raises:
            ValueError: a block of more than :data:`MAX_BLOCK_THREADS` threads (CUDA refuses
                the launch), naming the kernel."""
        threads = 1
        for d in (block if isinstance(block, tuple) else (block,)):
            threads *= d
        if threads > MAX_BLOCK_THREADS:
            raise ValueError(f"{name}: a block of {block} is {threads} threads, more than CUDA's "
                             f"{MAX_BLOCK_THREADS} per block; use a smaller tile or block in "
                             f"kernels/cuda/launch.py")
        self.kernel, self.grid, self.block, self.name = kernel, grid, block, name
        self._configured = None
        if not numba_config.ENABLE_CUDASIM:
            with warnings.catch_warnings():  # small graphs launch small grids on purpose
                warnings.filterwarnings("ignore", message="Grid size")
                self._configured = kernel[grid, block]

    @property
    def __name__(self) -> str:
        return self.name

    def __call__(self, *args):
        if self._configured is None:
            return self.kernel[self.grid, self.block](*args)
        return self._configured(*args)

    def __repr__(self) -> str:
        return f"Launch({self.name}, grid={self.grid}, block={self.block})"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def flat_steps(kernel, n: int, args: tuple, name: str) -> list:
    """Steps for a 1-D grid-stride kernel over ``n`` elements ([] when ``n == 0``)."""
    cfg = current()
    if n == 0:
        return []
    blocks = min(_ceil_div(n, cfg.block), cfg.max_blocks)
    return [(Launch(kernel, blocks, cfg.block, name), tuple(args))]


def row_steps(kernel, rows: int, args: tuple, name: str) -> list:
    """Steps for a row kernel over ``rows`` rows, ``current().row_block`` threads per row."""
    cfg = current()
    if rows == 0:
        return []
    blocks = min(rows, cfg.max_row_blocks)
    return [(Launch(kernel, blocks, cfg.row_block, name), tuple(args))]


def reduce_grid(n: int) -> int:
    """Blocks of a grid-wide reduction over ``n`` elements: ``ceil(n / block)``, at least 1 and
    at most ``reduce_blocks``."""
    cfg = current()
    return max(1, min(_ceil_div(n, cfg.block), cfg.reduce_blocks))


def grid_steps(kernel, blocks: int, args: tuple, name: str) -> list:
    """Steps for a grid-wide reduction kernel on ``blocks`` blocks of ``current().block``
    threads (:func:`reduce_grid`)."""
    return [(Launch(kernel, blocks, current().block, name), tuple(args))]


def tile_steps(kernel, m: int, n: int, args: tuple, name: str) -> list:
    """Steps for the tiled matmul over an ``m x n`` output.

    Raises:
        ValueError: ``m`` needs more than 65535 tile rows (the grid's y limit), naming the fix.
    """
    cfg = current()
    if m == 0 or n == 0:
        return []
    grid = (_ceil_div(n, cfg.tile), _ceil_div(m, cfg.tile))
    if grid[1] > 65535:
        raise ValueError(f"{name}: {m} rows need {grid[1]} tile rows, more than CUDA's grid limit "
                         f"65535; split the batch")
    threads = cfg.tile // cfg.tile_reg
    return [(Launch(kernel, grid, (threads, threads), name), tuple(args))]


def conv_tile_steps(kernel, m: int, n: int, groups: int, args: tuple, name: str) -> list:
    """Steps for a convolution's implicit GEMM over an ``m x n`` output per group: a grid
    ``(ceil(m / conv_tile), ceil(n / conv_tile), groups)`` of ``conv_tile x conv_tile`` blocks
    (rows along ``threadIdx.x``, so consecutive threads gather consecutive output positions).

    Raises:
        ValueError: more than 65535 column tiles or groups (the grid's y and z limits).
    """
    cfg = current()
    if m == 0 or n == 0:
        return []
    tile = cfg.conv_tile
    grid = (_ceil_div(m, tile), _ceil_div(n, tile), groups)
    if grid[1] > 65535 or grid[2] > 65535:
        raise ValueError(f"{name}: {n} columns and {groups} groups exceed CUDA's grid limits "
                         f"(65535 tiles / groups)")
    return [(Launch(kernel, grid, (tile, tile), name), tuple(args))]
