"""The global random generator: ``miniflow.manual_seed(n)`` makes initialisation and batching
reproducible (one NumPy ``Generator``, like ``torch.manual_seed``); :class:`RngState` saves and
restores where it is (PyTorch's ``get_rng_state`` / ``set_rng_state``), so a resumed training
run shuffles as the uninterrupted one.

Other random streams register here (:func:`register_stream`): ``manual_seed`` reseeds them and
:class:`RngState` saves and restores them with the generator, under the key ``"streams"``.
``miniflow.nn.dropout``'s counter-based ``[seed, offset]`` stream is one (the role of PyTorch's
CUDA generator state next to its CPU generator's)."""
from __future__ import annotations

import numpy as np

from .checks import is_integer

__all__ = ["manual_seed", "generator", "get_rng_state", "set_rng_state", "register_stream",
           "RngState"]

_GEN = [np.random.default_rng()]
_STREAMS: dict = {}


def register_stream(name: str, get, put, reseed) -> None:
    """Register the random stream ``name``: ``get() -> list of ints`` (its state),
    ``put(list of ints)`` (restore it), ``reseed(seed)`` (what :func:`manual_seed` calls with its
    seed). :class:`RngState` saves and restores every registered stream; registering a name again
    replaces it."""
    _STREAMS[name] = (get, put, reseed)


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the global generator with ``numpy.random.default_rng(seed)``; returns it.

    ``seed`` is an integer >= 0 of any size (a Python or NumPy integer): NumPy's ``SeedSequence``
    takes no negative seeds, so unlike ``torch.manual_seed`` negative values are refused.

    Raises:
        TypeError: ``seed`` is not an integer (a bool, float, string ...), naming it.
        ValueError: ``seed`` is negative, naming it.
    """
    if not is_integer(seed):
        raise TypeError(f"manual_seed: the seed must be an integer >= 0, got {seed!r} "
                        f"({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"manual_seed: the seed must be an integer >= 0 (NumPy's default_rng "
                         f"takes no negative seeds), got {seed}")
    _GEN[0] = np.random.default_rng(int(seed))
    for _, _, reseed in _STREAMS.values():
        reseed(int(seed))
    return _GEN[0]


def generator() -> np.random.Generator:
    """The global generator (used by parameter init and data batching)."""
    return _GEN[0]


class RngState:
    """The global generator's state as a ``state_dict()`` / ``load_state_dict()`` object for
    checkpoints: the bit generator's state, a plain dict of strings and integers
    (``numpy.random.Generator.bit_generator.state``: PCG64's 128-bit state and increment), which
    ``miniflow.save`` stores exactly; with registered streams (:func:`register_stream`) also
    ``"streams"``: name -> the stream's state (a list of ints). A state without ``"streams"`` (a
    checkpoint from before streams existed) restores the generator and leaves the streams as
    they are.
    """

    def state_dict(self) -> dict:
        """The global generator's current state (a copy), and every registered stream's."""
        state = _copy(generator().bit_generator.state)
        if _STREAMS:
            state["streams"] = {name: [int(v) for v in get()]
                                for name, (get, _, _) in sorted(_STREAMS.items())}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Make the global generator continue from ``state``.

        Raises:
            TypeError/ValueError: not a state of the global generator's bit generator (PCG64).
        """
        self.prepare_load_state_dict(state)()

    def prepare_load_state_dict(self, state: dict):
        """Check ``state`` and return a function of no arguments that sets it.

        Raises:
            as :meth:`load_state_dict`.
        """
        if not isinstance(state, dict):
            raise TypeError(f"RngState.load_state_dict: expected a dict (RngState().state_dict()),"
                            f" got {type(state).__name__}")
        state = dict(state)
        streams = state.pop("streams", {})
        unknown = sorted(set(streams) - set(_STREAMS)) if isinstance(streams, dict) else None
        if unknown is None or unknown:
            raise ValueError(f"RngState.load_state_dict: unknown random stream(s) {unknown}; "
                             f"registered: {sorted(_STREAMS)}")
        kind = type(generator().bit_generator)
        probe = kind()
        try:
            probe.state = state
        except (TypeError, ValueError, KeyError) as e:
            raise type(e)(f"RngState.load_state_dict: not a state of the {kind.__name__} "
                          f"generator ({e}); expected RngState().state_dict()'s layout") from None
        state = _copy(state)
        streams = {name: [int(v) for v in values] for name, values in streams.items()}

        def assign():
            generator().bit_generator.state = state
            for name, values in streams.items():
                _STREAMS[name][1](values)
        return assign


def get_rng_state() -> dict:
    """The state of the global generator and its streams (``torch.get_rng_state``'s role):
    ``RngState().state_dict()``, a dict of strings and integers (PyTorch's is a uint8 tensor);
    give it to :func:`set_rng_state` to draw the same numbers again (initialisation, batching,
    dropout in a graph)."""
    return RngState().state_dict()


def set_rng_state(new_state: dict) -> None:
    """Make the global generator and its streams continue from ``new_state``, a
    :func:`get_rng_state` (``torch.set_rng_state``'s role).

    Raises:
        TypeError/ValueError: not a :func:`get_rng_state` result (as
            :meth:`RngState.load_state_dict`).
    """
    RngState().load_state_dict(new_state)


def _copy(state):
    """A deep copy of a bit-generator state (dicts of ints and strings)."""
    return {k: _copy(v) for k, v in state.items()} if isinstance(state, dict) else state
