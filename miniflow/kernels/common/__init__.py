"""Kernel code shared by every backend, imported by ``kernels.cpu`` and ``kernels.cuda`` and
importing neither.

* ``table``: a backend's ``KERNELS`` table (merged from its modules) and ``builder_for``, which
  derives the builder of an elementwise op when it has no entry;
* ``elementwise``: those derived builders and the other elementwise builders, over a backend's
  step makers (``StepMakers``);
* ``movement``, ``reduce``, ``update``, ``loss_scale``, ``conv``, ``normalization``, ``pool``:
  the builders whose planning is the same on every backend (layouts, geometries, empty outputs),
  over the backend's loops (``family``: the one step-maker signature of ``pool``, ``conv``,
  ``normalization``, ``movement`` and ``reduce``, one step maker per op type); ``update`` and ``loss_scale`` also hold the scalar
  bodies of the optimizer updates and of the dynamic loss-scale schedule, compiled for both
  backends (``numba.njit`` and ``cuda.jit(device=True)``);
* ``layout``: broadcast, reduction and row planning on shapes;
* ``codegen``: lowering a fused expression to kernel source;
* ``cache``: where Numba's disk cache keeps the kernels.
"""
