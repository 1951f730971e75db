"""``python -m miniflow.exercises list | check N [--file PATH]``: the exercises' checker
(:mod:`miniflow.exercises`). Exit status 0 when the exercise passes, 1 when it does not yet, 2 on
a usage error, 141 when stdout was closed early (``list | head -1``)."""
import argparse
import os
import sys

from . import EXERCISES, check, default_file, exercise


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m miniflow.exercises",
                                description="check your solutions of tutorials/exercises/")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the exercises, with the file each one asks you to fill in")
    c = sub.add_parser("check", help="check exercise N")
    c.add_argument("number", type=int, help="the exercise's number")
    c.add_argument("--file", default=None, help="the file to check (default: the exercise's "
                                                "stub in tutorials/exercises/)")
    args = p.parse_args(argv)
    if args.command == "list":
        for n in EXERCISES:
            ex = exercise(n)
            print(f"exercise {n}: {ex.TITLE}; write {ex.FUNCTION}() in {default_file(n)}")
        return 0
    if args.file is not None and not os.path.isfile(args.file):
        why = "a folder, not a file" if os.path.isdir(args.file) else "no such file"
        print(f"error: --file {args.file}: {why}", file=sys.stderr)
        return 2
    try:
        r = check(args.number, args.file)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    title = exercise(args.number).TITLE
    if r.passed:
        print(f"exercise {r.number} ({title}): PASSED, {len(r.checks)} checks on {r.path}")
        for line in r.checks:
            print(f"  ok: {line}")
        return 0
    print(f"exercise {r.number} ({title}): NOT YET ({r.path})")
    print(f"  {r.message}")
    return 1


if __name__ == "__main__":
    from ..experiments.interrupts import quiet_on_closed_stdout
    sys.exit(quiet_on_closed_stdout(main))      # ... list | head -1: quietly, exit code 141
