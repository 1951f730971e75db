"""CUDA kernel of ``all_reduce`` (semantics in ``miniflow.ops.collective``): the MPI collective on
host buffers, staged. The MPICH that the ``dist`` extra installs is not CUDA-aware (it cannot read
device memory), so the builder allocates one host buffer per input and the steps are: copy
the inputs device -> host, reduce the host buffers across the ranks in place
(``kernels.common.collective``), copy them host -> device into the outputs. The copies run on the
default stream, after the kernels that made the gradients and before those that read the result.

These are the only steps of the CUDA backend that copy between host and device (the builder
contract, ``miniflow.runtime.backend.Backend``, allows it for collectives).
"""
from __future__ import annotations

import numpy as np

from ..common.collective import all_reduce_step

__all__ = ["BUILDERS"]


def device_to_host(devices, hosts):
    """``hosts[k][:] = devices[k]`` (synchronous: waits for the kernels writing them)."""
    for d, h in zip(devices, hosts):
        d.copy_to_host(h)


def host_to_device(hosts, devices):
    """``devices[k][:] = hosts[k]``."""
    for h, d in zip(hosts, devices):
        d.copy_to_device(h)


def build_all_reduce(node, ins, outs):
    """Three steps: the inputs to host buffers, the collective on them in place, the host buffers
    to the outputs. (Pageable host memory: a CUDA-aware MPI, or pinned buffers, would save the
    copies or speed them up; neither is measured yet, no GPU was at hand.)"""
    hosts = [np.empty(a.shape, a.dtype) for a in ins]
    return [(device_to_host, (tuple(ins), tuple(hosts))), all_reduce_step(node, hosts, hosts),
            (host_to_device, (tuple(hosts), tuple(outs)))]


BUILDERS = {"all_reduce": build_all_reduce}
"""Op type -> builder for the collectives."""
