"""Reading a step's outcome back lazily: :data:`LEDGER`, the queue of pending read-backs.

What a training step tells the host (the grad scaler's non-finite counts and the scale they were
taken at, hence ``found_inf``, ``num_skipped_steps``, the optimizers' skipped steps) lives on the
device. Reading it after every step would make every step wait for the device. Instead the
compile driver (``nn.Graph``) starts an asynchronous copy of it into a host buffer
(``Backend.readback``) and files it here with what to do with it (``defer``); the entry is
applied, in order, when its copy has arrived:

* :meth:`Ledger.poll` (after every graph call): applies the entries whose copies have arrived,
  without waiting;
* :meth:`Ledger.flush`: waits for every pending copy and applies them all. Every reader of the
  state calls it first (``GradScaler.found_inf``, ``num_skipped_steps``,
  ``consecutive_floor_skips``, ``state_dict``; ``Optimizer.num_steps``, ``num_skipped_steps``),
  so what a reader sees is always up to date: a read is one wait for the device, and no read
  means no wait.

On the cpu backend a read-back is complete at once, so every entry is applied by the poll at the
end of its own graph call: the state is updated, and ``NonFiniteGradientsError`` raised, in the
call that made the step, as before read-backs were lazy. On cuda the GPU runs behind the host, so
an entry is applied by the first poll after the GPU finished its step, or by the next read,
whichever comes first; a graph keeps at most ``Backend.readback_depth`` steps pending (then it
waits for the oldest). So on cuda ``NonFiniteGradientsError`` is raised by a later graph call
than the one that made the step that reached ``max_consecutive_skips`` (at most
``readback_depth`` calls later; the steps in between were skipped too, so they changed no
weights), or by the first read of the scaler's state.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

__all__ = ["Ledger", "LEDGER", "HostReadback", "LedgerAttribute"]


class Ledger:
    """A FIFO of ``(readback, apply)`` entries; ``apply(host_arrays)`` runs once the read-back's
    copies arrived (``readback.ready()`` / ``readback.wait()``, see ``Backend.readback``).

    Thread-safe: entries are applied in the order they were filed, each exactly once (an entry is
    removed before it is applied, so an exception raised by ``apply`` is raised once)."""

    def __init__(self):
        self._pending: deque = deque()
        self._lock = threading.RLock()

    def defer(self, readback, apply) -> None:
        """File ``apply`` to run on ``readback``'s host arrays once they arrived."""
        with self._lock:
            readback.pending = True
            self._pending.append((readback, apply))

    def poll(self) -> None:
        """Apply the entries whose copies arrived, oldest first, stopping at the first that has
        not (no waiting)."""
        pending = self._pending
        if not pending:
            return
        with self._lock:
            while pending and pending[0][0].ready():
                self._apply(pending.popleft())

    def flush(self) -> None:
        """Wait for every pending copy and apply every entry, oldest first."""
        pending = self._pending
        if not pending:
            return
        with self._lock:
            while pending:
                self._apply(pending.popleft())

    def __len__(self) -> int:
        return len(self._pending)

    @staticmethod
    def _apply(entry) -> None:
        readback, apply = entry
        hosts = readback.wait()
        readback.pending = False
        apply(hosts)


LEDGER = Ledger()
"""The process's pending read-backs."""


class HostReadback:
    """A read-back that copies at once (``Backend.readback`` of the cpu backend, and of the cuda
    backend under the simulator): ``copy(i)`` copies ``arrays[i]`` into ``hosts[i]`` with
    ``to_host(array, host)``, ``ready()`` is always True."""

    def __init__(self, arrays, to_host):
        self.pending = False
        self._arrays = list(arrays)
        self._to_host = to_host
        self.hosts = [np.empty(a.shape, a.dtype) for a in self._arrays]

    def copy(self, i: int) -> None:
        self._to_host(self._arrays[i], self.hosts[i])

    def record(self) -> None:
        pass

    def ready(self) -> bool:
        return True

    def wait(self) -> list:
        return self.hosts


class LedgerAttribute:
    """A data descriptor for state that pending entries update (``GradScaler.found_inf``,
    ``Optimizer.num_steps`` ...): reading or assigning it flushes :data:`LEDGER` first, so the
    value is up to date. Stored in the instance ``__dict__`` under the same name; code that runs
    inside an entry's ``apply`` writes ``obj.__dict__`` directly (a flush there would apply later
    entries first)."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        LEDGER.flush()
        try:
            return obj.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None

    def __set__(self, obj, value):
        LEDGER.flush()
        obj.__dict__[self.name] = value
