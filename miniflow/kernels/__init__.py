"""Numba kernels: ``cpu`` (the CPU backend: ``KERNELS``, op type name -> kernel builder) and
``cuda`` (the CUDA backend's ``KERNELS``, same contract, numba-cuda kernels; launch configuration
in ``cuda_launch``). Shared by both: ``elementwise_table`` (the elementwise builders, derived from
the ops' scalar functions in ``miniflow.ops``), ``layout`` (broadcast and reduction planning),
``codegen`` (lowering fused expressions), ``cache`` (Numba's disk cache); CPU only: ``fp16``
(float16 storage). The CPU and CUDA modules never import each other."""
