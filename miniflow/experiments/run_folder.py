"""The ``--checkpoint`` folder of a ``miniflow train`` run: its lock, its checkpoint file and its
loss log.

- ``checkpoint.lock``: held (``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows) from the
  start of a run to its end, so a second run on the same folder is refused at once instead of
  both overwriting each other's checkpoint. The operating system releases the lock when the
  process ends, however it ends (SIGKILL included): a lock file left behind never blocks a
  later run.
- ``checkpoint.safetensors``: the training state (``miniflow.save``, atomic); it holds only
  what resuming needs, so its size does not grow with the run.
- ``losses.csv``: the loss of every update (``step,loss``, one line per update, Python's
  round-trip ``repr``), appended and fsynced before each checkpoint is written, so it holds at
  least the checkpoint's steps. Resuming keeps the checkpoint's steps and drops the lines of
  steps after it (a run killed between the two writes), so the log of a resumed run equals the
  uninterrupted run's.
"""
from __future__ import annotations

import os
import tempfile

from ..serialization import _write_atomic

__all__ = ["CHECKPOINT_FILE", "LOCK_FILE", "LOSS_LOG", "FolderInUseError", "RunFolder",
           "check_not_in_use"]

CHECKPOINT_FILE = "checkpoint.safetensors"
"""The checkpoint's file name in the ``--checkpoint`` folder."""
LOCK_FILE = "checkpoint.lock"
"""The lock file, held by the run that uses the folder."""
LOSS_LOG = "losses.csv"
"""The loss log's file name."""
_HEADER = "step,loss\n"


class FolderInUseError(OSError):
    """Another process holds the folder's lock (another run trains into it)."""


def _lock(fd: int) -> bool:
    """Take the lock on the open file ``fd`` without waiting; False when another holds it."""
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _lock_or_raise(fd: int, folder: str) -> None:
    """Take the lock of ``fd`` (``folder``'s lock file), or raise :class:`FolderInUseError`
    naming the pid the file holds (closing ``fd``)."""
    if not _lock(fd):
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        lock_path = os.path.join(folder, LOCK_FILE)
        raise FolderInUseError(f"{folder!r} is in use by another run (pid {holder} holds "
                               f"{lock_path!r}): wait for it to end, or give another "
                               "--checkpoint folder")


def check_not_in_use(folder) -> None:
    """Raise :class:`FolderInUseError` when another process holds ``folder``'s lock, creating
    nothing (no folder, no lock file): the lock is taken and released at once when free.

    Raises:
        FolderInUseError: another run holds the lock (naming its pid).
    """
    folder = os.fspath(folder)
    try:
        fd = os.open(os.path.join(folder, LOCK_FILE), os.O_RDWR)
    except OSError:                     # no lock file (or no folder): nobody holds it
        return
    _lock_or_raise(fd, folder)
    os.close(fd)                        # releases the lock just taken


class RunFolder:
    """The ``--checkpoint`` folder ``folder`` of a run (see the module docstring): created if
    missing, checked for writing, and locked when ``lock`` (under data parallel only rank 0,
    which writes, locks it). :meth:`close` releases the lock.

    Raises:
        FolderInUseError: another process holds the lock (naming its pid).
        OSError: the folder cannot be created or written.
    """

    def __init__(self, folder, lock: bool = True):
        self.folder = os.fspath(folder)
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise NotADirectoryError(f"checkpoint folder {self.folder!r} is a file, not a "
                                     "folder: give a folder (or a new name) for the run")
        try:
            os.makedirs(self.folder, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.folder):
                pass
        except OSError as e:            # under a file, no permission, a read-only file system
            raise type(e)(f"checkpoint folder {self.folder!r} cannot be made or written: "
                          f"{e.strerror or e}; give a writable folder for the run") from None
        self.path = os.path.join(self.folder, CHECKPOINT_FILE)
        self.log = os.path.join(self.folder, LOSS_LOG)
        self.files = tuple(os.path.join(self.folder, f) for f in (CHECKPOINT_FILE, LOCK_FILE,
                                                                  LOSS_LOG))
        self._fd = None
        if lock:
            lock_path = os.path.join(self.folder, LOCK_FILE)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
            _lock_or_raise(fd, self.folder)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd

    def close(self) -> None:
        """Release the lock (closing the file releases it; the file stays)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def append_losses(self, losses: list, start: int) -> None:
        """Append the losses of steps ``start + 1 ..`` (``losses[start:]``) to the log, fsynced."""
        new = not os.path.exists(self.log)
        with open(self.log, "a", encoding="ascii") as f:
            f.write((_HEADER if new else "")
                    + "".join(f"{start + i + 1},{x!r}\n" for i, x in enumerate(losses[start:])))
            f.flush()
            os.fsync(f.fileno())

    def read_losses(self, steps: int) -> list:
        """The losses of steps 1..``steps`` from the log (lines after them are ignored:
        :meth:`start_log` cuts them).

        Raises:
            ValueError: no log, or one with fewer steps or lines that are not ``step,loss``.
        """
        try:
            with open(self.log, encoding="ascii") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        losses = []
        for n, line in enumerate(lines[1:steps + 1], 1):
            step, _, loss = line.partition(",")
            if step != str(n):
                raise ValueError(f"{self.log!r}, line {n + 1}: expected step {n}, got {line!r}")
            losses.append(float(loss))
        if len(losses) < steps or (lines and lines[0] + "\n" != _HEADER):
            raise ValueError(f"{self.log!r} holds the losses of {len(losses)} steps, but the "
                             f"checkpoint is at step {steps} (the log was edited or deleted)")
        return losses

    def start_log(self, losses: list) -> None:
        """Make the log hold exactly ``losses`` (steps 1..len) at the start of a run: an
        existing log is replaced, atomically (after a resume it may hold the steps of a run
        killed after its last checkpoint; a new run's folder may hold the log of a run killed
        before its first); without one and without losses there is nothing to do
        (:meth:`append_losses` creates it)."""
        if losses or os.path.exists(self.log):
            _write_atomic(self.log, (_HEADER + "".join(
                f"{i},{x!r}\n" for i, x in enumerate(losses, 1))).encode("ascii"))
