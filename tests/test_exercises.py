"""The exercises of ``tutorials/exercises/`` and their checker (``python -m miniflow.exercises``):
every stub fails its check with the "not done yet" message, every solution in
``tutorials/exercises/solutions/`` passes, a typical wrong answer fails with a message naming
what is wrong, and the throwaway ops are unregistered after a check. Followed: minitorch's task
tests (a stub fails until filled in).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from miniflow import exercises
from miniflow.ops import all_ops, scalar_functions

ROOT = Path(__file__).resolve().parent.parent
EXERCISE_DIR = ROOT / "tutorials" / "exercises"
SOLUTIONS = EXERCISE_DIR / "solutions"

WRONG = {
    1: ("def cube_grad(node, grads, emit):\n"
        "    return [emit('scalar_mul', emit('broadcast_mul', node.inputs[0], node.inputs[0]),"
        " scalar=3.0)]\n",
        "without the incoming gradient: the chain rule multiplies the op's derivative by dy"),
    2: ("def amp_lists():\n"
        "    return {'exercise2_scaled_matmul': 'white', 'exercise2_logsumexp': 'gray',\n"
        "            'exercise2_flip': 'clear', 'exercise2_scale_shift': 'gray'}\n",
        "exercise2_logsumexp: you chose 'gray', but it belongs in 'black': exp(12) = 162755 is "
        "above float16's largest number 65504"),
    3: ("def fold_casts(graph, ctx=None):\n"
        "    made_by = {}\n"
        "    for node in graph.nodes:\n"
        "        if node.op.name == 'cast':\n"
        "            inner = made_by.get(node.inputs[0])\n"
        "            if inner is not None:\n"
        "                x = inner.inputs[0]\n"
        "                if x.dtype == node.outputs[0].dtype:\n"
        "                    graph.replace_uses(node.outputs[0], x)\n"
        "                node.inputs = [x]\n"
        "            made_by[node.outputs[0]] = node\n"
        "    return graph\n",
        "on x: float32 -> float16 -> float32: your pass changed the values of result output0"),
    4: ("def update_scale(scale, tracker, found_inf, gf=2.0, bf=0.5, gi=2000):\n"
        "    if found_inf:\n"
        "        return scale * bf, tracker\n"
        "    return (scale * gf, 0) if tracker + 1 == gi else (scale, tracker + 1)\n",
        "you returned (scale 512, tracker 2), the schedule gives (scale 512, tracker 0)"),
}


def test_every_exercise_has_a_stub_a_solution_and_a_wrong_answer_case():
    stubs = sorted(p.name for p in EXERCISE_DIR.glob("ex*.py"))
    assert stubs == sorted(exercises.exercise(n).STUB for n in exercises.EXERCISES)
    assert sorted(p.name for p in SOLUTIONS.glob("ex*.py")) == stubs
    assert sorted(WRONG) == sorted(exercises.EXERCISES)
    readme = (ROOT / "tutorials" / "README.md").read_text()
    assert all(f"exercises/{s}" in readme for s in stubs)


@pytest.mark.parametrize("number", sorted(exercises.EXERCISES))
def test_stub_fails_with_the_not_done_yet_message(number):
    r = exercises.check(number)
    assert not r.passed
    fn = exercises.exercise(number).FUNCTION
    assert f"not done yet: {fn}() in {exercises.default_file(number)} still raises " \
           f"NotImplementedError" in r.message


@pytest.mark.parametrize("number", sorted(exercises.EXERCISES))
def test_solution_passes(number):
    r = exercises.check(number, SOLUTIONS / exercises.exercise(number).STUB)
    assert r.passed, r.message
    assert len(r.checks) >= 3


@pytest.mark.parametrize("number", sorted(exercises.EXERCISES))
def test_wrong_answer_says_what_is_wrong(number, tmp_path):
    code, expected = WRONG[number]
    path = tmp_path / f"wrong{number}.py"
    path.write_text(code)
    r = exercises.check(number, path)
    assert not r.passed
    assert expected in r.message, r.message


def test_throwaway_op_is_unregistered_even_when_the_rule_raises(tmp_path):
    path = tmp_path / "raises.py"
    path.write_text("def cube_grad(node, grads, emit):\n"
                    "    return [emit('no_such_op', grads[0])]\n")
    r = exercises.check(1, path)
    assert not r.passed and "no_such_op" in r.message, r.message
    assert "exercise1_cube" not in all_ops() and "exercise1_cube" not in scalar_functions()


def test_missing_or_broken_files_are_explained(tmp_path):
    assert "does not exist; pass the file to check with --file PATH" in \
        exercises.check(2, tmp_path / "nope.py").message
    (tmp_path / "syntax.py").write_text("def amp_lists(:\n")
    assert "could not be imported: SyntaxError" in \
        exercises.check(2, tmp_path / "syntax.py").message
    (tmp_path / "other.py").write_text("def something():\n    pass\n")
    assert "defines no function amp_lists()" in exercises.check(2, tmp_path / "other.py").message
    with pytest.raises(ValueError, match="there is no exercise 9; the exercises are 1, 2, 3, 4"):
        exercises.check(9)


@pytest.mark.parametrize("where", ["import", "call"])
def test_a_file_that_calls_sys_exit_does_not_yet_pass(where, tmp_path):
    """A learner's ``sys.exit()`` (``exit()`` left from debugging) ended the checker at once,
    with exit status 0 and no output: a script or CI took the exercise as passed. It is now
    NOT YET (status 1), naming the call, at import and inside the function alike."""
    path = tmp_path / "exits.py"
    body = "    return {}\n" if where == "import" else "    import sys; sys.exit(0)\n"
    path.write_text(f"def amp_lists():\n{body}" + ("exit()\n" if where == "import" else ""))
    r = exercises.check(2, path)
    assert not r.passed
    prefix = f"{path} could not be imported: " if where == "import" else "amp_lists() "
    assert r.message.startswith(prefix + "called sys.exit(") and "remove the call" in r.message
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cli = subprocess.run([sys.executable, "-m", "miniflow.exercises", "check", "2", "--file",
                          str(path)], env=env, capture_output=True, text=True)
    assert cli.returncode == 1 and "NOT YET" in cli.stdout, (cli.returncode, cli.stdout)


def test_command_line_exit_status_and_output(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    run = [sys.executable, "-m", "miniflow.exercises"]
    stub = subprocess.run(run + ["check", "2"], env=env, capture_output=True, text=True)
    assert stub.returncode == 1 and "NOT YET" in stub.stdout and "not done yet" in stub.stdout
    good = subprocess.run(run + ["check", "2", "--file", str(SOLUTIONS / "ex2_amp_lists.py")],
                          env=env, capture_output=True, text=True)
    assert good.returncode == 0 and "PASSED, 4 checks" in good.stdout, good.stdout
    bad = subprocess.run(run + ["check", "7"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "there is no exercise 7" in bad.stderr
    missing = subprocess.run(run + ["check", "1", "--file", str(tmp_path / "nope.py")], env=env,
                             capture_output=True, text=True)        # a usage error: 2, not 1
    assert missing.returncode == 2 and "nope.py: no such file" in missing.stderr
    folder = subprocess.run(run + ["check", "1", "--file", str(tmp_path)], env=env,
                            capture_output=True, text=True)    # said "no such file"
    assert folder.returncode == 2 and f"--file {tmp_path}: a folder, not a file" in folder.stderr
