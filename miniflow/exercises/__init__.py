"""Exercises that check themselves (minitorch's model): a stub for the learner to fill in
(``tutorials/exercises/exN_*.py``, each raising ``NotImplementedError`` until done) and, here, a
checker per exercise that runs the learner's code against an independent reference and says in
plain words what is wrong.

Run ``python -m miniflow.exercises list`` for the exercises and
``python -m miniflow.exercises check N`` to check exercise ``N`` (``--file PATH`` checks another
file, e.g. a solution). Each checker module (``ex1_gradient_rule`` ...) has ``TITLE``, ``STUB``
(the stub's file name), ``FUNCTION`` (what the learner writes) and ``check(module)``, which
raises :class:`NotYet` with the explanation on the first thing that is wrong and returns the list
of checks that passed.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NotYet", "Result", "EXERCISES", "exercise", "default_file", "load", "check"]

EXERCISES = {1: "ex1_gradient_rule", 2: "ex2_amp_lists", 3: "ex3_fold_casts",
             4: "ex4_loss_scale_schedule"}
"""Exercise number -> checker module in this package."""

STUB_DIR = Path(__file__).resolve().parent.parent.parent / "tutorials" / "exercises"
"""Where the stubs live in a source checkout (``pip install -e .``)."""


class NotYet(Exception):
    """The learner's code is not right yet; the message says what is wrong, in plain words."""


@dataclass
class Result:
    """The outcome of checking one exercise: ``passed``, the checks that passed, and ``message``
    (what is wrong, when not passed)."""
    number: int
    path: Path
    passed: bool
    checks: list = field(default_factory=list)
    message: str = ""


def exercise(number: int):
    """The checker module of exercise ``number``; ValueError naming the valid numbers."""
    if number not in EXERCISES:
        raise ValueError(f"there is no exercise {number}; the exercises are "
                         f"{', '.join(map(str, EXERCISES))} (python -m miniflow.exercises list)")
    return importlib.import_module(f"{__name__}.{EXERCISES[number]}")


def default_file(number: int) -> Path:
    """The stub of exercise ``number`` in this checkout's ``tutorials/exercises/``."""
    return STUB_DIR / exercise(number).STUB


def load(path: Path):
    """Import the learner's file ``path`` as a fresh module (a new one each call)."""
    path = Path(path)
    if not path.is_file():
        raise NotYet(f"{path} does not exist; pass the file to check with --file PATH")
    name = f"_miniflow_exercise_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SystemExit as e:
        raise NotYet(f"{path} could not be imported: {_exit_message(e)}") from e
    except Exception as e:  # the learner's file itself fails to import
        raise NotYet(f"{path} could not be imported: {type(e).__name__}: {e}") from e
    finally:
        sys.modules.pop(name, None)
    return module


def check(number: int, path: Path | None = None) -> Result:
    """Check exercise ``number`` on ``path`` (default: its stub, :func:`default_file`)."""
    checker = exercise(number)
    path = Path(path) if path is not None else default_file(number)
    try:
        module = load(path)
        fn = getattr(module, checker.FUNCTION, None)
        if not callable(fn):
            raise NotYet(f"{path} defines no function {checker.FUNCTION}(); the stub has one: "
                         f"copy it from {default_file(number)}")
        checks = checker.check(module)
    except NotImplementedError:
        return Result(number, path, False, [], (
            f"not done yet: {checker.FUNCTION}() in {path} still raises NotImplementedError. "
            f"Replace the `raise NotImplementedError` with your code (its docstring says what it "
            f"must do), then run this check again."))
    except NotYet as e:
        return Result(number, path, False, [], str(e))
    return Result(number, path, True, checks)


def learner_call(name: str, fn, *args):
    """Call the learner's ``fn``; an exception other than NotImplementedError, or a
    ``sys.exit()``, becomes :class:`NotYet` naming the function, the arguments and the error."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except NotYet:
        raise
    except SystemExit as e:
        raise NotYet(f"{name} {_exit_message(e)}") from e
    except Exception as e:
        raise NotYet(f"{name} raised {type(e).__name__}: {e}") from e


def _exit_message(e: SystemExit) -> str:
    """The learner's code called ``sys.exit()`` (``exit()``, ``quit()``), which would otherwise
    end the checker with its exit status (0: passed, to a script or CI that runs it)."""
    return (f"called sys.exit({e.code!r}) (or exit(), quit()), which would end the check; "
            "remove the call")
