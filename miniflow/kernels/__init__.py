"""Numba kernels: ``scalar`` (shared scalar math), ``fp16`` (float16 storage on the CPU) and
``cpu`` (the CPU backend: ``KERNELS``, op type -> kernel builder)."""
