"""Numba kernels, one package per backend with mirrored module names (OneFlow's
``oneflow/core/ep/{common,cpu,cuda}``): ``cpu`` (Numba CPU kernels) and ``cuda`` (numba-cuda
kernels), each with a table ``KERNELS`` and ``builder_for(op)`` (the backend protocol and the
builder contract: ``miniflow.runtime.backend.Backend``), and ``common``, the code both share:
the builders derived from the ops' scalar functions, the scalar bodies of the updates and of the
loss-scale schedule, layout planning, fused-kernel code generation and the disk cache. ``cpu`` and
``cuda`` never import each other; ``common`` imports neither."""
