"""Numba kernels: ``scalar`` (shared scalar math), ``fp16`` (float16 storage on the CPU), ``cpu``
(the CPU backend: ``KERNELS``, op type -> kernel builder) and ``cuda`` (the CUDA backend's
``KERNELS``, same contract, numba-cuda kernels; launch configuration in ``cuda_launch``)."""
