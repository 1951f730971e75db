"""Training checkpoints: ``miniflow train --checkpoint DIR`` saved at step 100, killed (SIGKILL)
in the middle of its save at step 200, resumed from the file: the rest of the run is bit-identical
to an uninterrupted run (losses, weights, optimizer state, loss scale, scheduler, data order);
``miniflow.checkpoint.restore`` is all or nothing and names the part and the key that does not
fit; truncated and edited files, other settings and other models are clear errors."""
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import miniflow as mf
from miniflow import load, save
from miniflow.checkpoint import restore
from miniflow.cli import main
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.experiments.run_folder import LOSS_LOG, RunFolder
from miniflow.experiments.train import (CHECKPOINT_FILE, ResumeError, epoch_batches,
                                        make_lr_schedule, train_digits)
from miniflow.optim.lr_scheduler import CosineAnnealingLR
from miniflow.random import RngState

RUN = ["train", "--epochs", "10", "--hidden", "32", "--amp", "--lr-schedule", "warmup-cosine",
       "--accumulate", "2", "--clip-norm", "1.0", "--checkpoint-every", "100"]
"""AMP with a dynamic scaler, a warm-up then cosine schedule, 2 micro-batches per update and
clipping: 23 updates per epoch, 230 in all; checkpoints at 100, 200 and 230."""

_CHILD = """
import os, sys, time, types
import miniflow.serialization as S
from miniflow.cli import main
pause_at = int(os.environ.get("PAUSE_AT_SAVE", "0"))
real_write_atomic, saves = S._write_atomic, [0]

def write_atomic(path, data):  # on save number pause_at: stop after the first 4 KiB chunk
    saves[0] += 1
    if saves[0] == pause_at:
        S._CHUNK = 1 << 12
        def write(fd, buf):
            n = os.write(fd, buf)
            print("paused", flush=True)
            time.sleep(600)
            return n
        proxy = {k: getattr(os, k) for k in dir(os) if not k.startswith("__")}
        S.os = types.SimpleNamespace(**{**proxy, "write": write})
    return real_write_atomic(path, data)

S._write_atomic = write_atomic
sys.exit(main(sys.argv[1:]))
"""


def _child(args, pause_at=0) -> subprocess.Popen:
    env = dict(os.environ, PAUSE_AT_SAVE=str(pause_at),
               PYTHONPATH=os.pathsep.join(p for p in sys.path if os.path.isdir(p)))
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    watchdog = threading.Timer(300, proc.kill)  # a hung child fails the test, not the run
    watchdog.daemon = True
    watchdog.start()
    return proc


def assert_identical(a, b, where="checkpoint"):
    """The same tree: same keys and types, arrays of the same dtype, shape and bits."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_a_run_killed_while_saving_resumes_bit_identical_to_an_uninterrupted_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    a = _child([*RUN, "--checkpoint", str(straight)])
    b = _child([*RUN, "--checkpoint", str(killed)], pause_at=2)   # the save at step 200
    assert b.stdout.readline().startswith(b"backend: cpu")    # the CLI says its backend first
    assert b.stdout.readline() == b"paused\n"
    b.send_signal(signal.SIGKILL)
    assert b.wait() == -signal.SIGKILL
    temps = [f for f in os.listdir(killed) if f.endswith(".tmp")]
    assert len(temps) == 1 and os.path.getsize(killed / temps[0]) == 1 << 12  # half written
    at_100 = load(killed / CHECKPOINT_FILE)               # the step-100 file, intact
    assert at_100["run"]["step"] == 100 and "losses" not in at_100["run"]
    losses_100 = _logged(killed)[:100]     # the log is appended before each checkpoint is
    assert len(_logged(killed)) == 200     # written: it has the killed save's steps too
    c = _child([*RUN, "--checkpoint", str(killed), "--resume"])
    out_c, err_c = c.communicate()
    out_a, err_a = a.communicate()
    assert a.returncode == 0 and c.returncode == 0, (err_a, err_c)
    assert b"resumed from step 100" in out_c and b"for 130 steps" in out_c
    final_a, final_c = load(straight / CHECKPOINT_FILE), load(killed / CHECKPOINT_FILE)
    assert final_a["run"]["step"] == 230 and len(_logged(straight)) == 230
    assert final_a["grad_scaler"] is not None and final_a["scheduler"] is not None
    assert_identical(final_a, final_c)                   # weights, optimizer, scale ...
    assert _logged(straight) == _logged(killed) and _logged(straight)[:100] == losses_100

    def results(out):
        return [ln for ln in out.splitlines() if ln.startswith((b"final loss", b"train acc",
                                                                 b"test acc"))]
    assert len(results(out_a)) == 3 and results(out_a) == results(out_c)


def _logged(folder) -> list:
    """The losses of the run's log (``losses.csv``: ``step,loss`` lines after a header)."""
    lines = (folder / LOSS_LOG).read_text().splitlines()
    assert lines[0] == "step,loss"
    assert [int(ln.split(",")[0]) for ln in lines[1:]] == list(range(1, len(lines)))
    return [float(ln.split(",")[1]) for ln in lines[1:]]


def test_resuming_in_process_continues_the_same_run(tmp_path):
    """The library path of the same (``train_digits``): a run stopped right after its save at
    step 20 and resumed gives the uninterrupted run's losses and final checkpoint, bit for
    bit; with cosine decay, 4 micro-batches, clipping and AMP."""
    kw = dict(epochs=2, batch_size=64, hidden=16, lr_schedule="cosine", accumulate=4,
              clip_norm=0.5, amp=True, progress=False, checkpoint_every=20)
    whole = train_digits(**kw, checkpoint=tmp_path / "whole")
    assert whole["steps"] == 46 == len(whole["losses"]) and whole["resumed_from"] is None
    _checkpoint_at(kw, 20, tmp_path / "cut")
    resumed = train_digits(**kw, checkpoint=tmp_path / "cut", resume=True)
    assert resumed["resumed_from"] == 20 and resumed["losses"] == whole["losses"]
    assert_identical(load(tmp_path / "whole" / CHECKPOINT_FILE),
                     load(tmp_path / "cut" / CHECKPOINT_FILE))
    assert _logged(tmp_path / "whole") == _logged(tmp_path / "cut") == whole["losses"]


def test_the_checkpoint_stays_bounded_and_the_losses_go_to_an_append_only_log(tmp_path):
    """Issue 22 item 10: a checkpoint holds what resuming needs, so its size does not grow with
    the run (before: every loss as JSON, 602 KB at step 23,000, rewritten at each save); the
    losses are appended to ``losses.csv``. A log with lines after the checkpoint's step (a run
    killed between its log and its checkpoint) is cut back to the checkpoint on resume. As
    PyTorch's checkpointing recipe ("Saving and loading a general checkpoint"), which saves
    the states and the epoch, and leaves the loss history to a logger."""
    kw = dict(epochs=1, hidden=8, progress=False, checkpoint_every=5)
    short = train_digits(**kw, checkpoint=tmp_path / "short")
    long = train_digits(**{**kw, "epochs": 4}, checkpoint=tmp_path / "long")
    size = [os.path.getsize(tmp_path / f / CHECKPOINT_FILE) for f in ("short", "long")]
    assert abs(size[1] - size[0]) < 16, size        # 23 against 92 steps: a digit or so more
    assert "losses" not in load(tmp_path / "long" / CHECKPOINT_FILE)["run"]
    assert _logged(tmp_path / "short") == short["losses"] and len(short["losses"]) == 23
    assert _logged(tmp_path / "long") == long["losses"] and len(long["losses"]) == 92
    log = tmp_path / "short" / LOSS_LOG                     # a killed run's extra lines
    log.write_text(log.read_text() + "24,0.5\n25,0.25\n")
    again = train_digits(**kw, checkpoint=tmp_path / "short", resume=True)
    assert again["losses"] == short["losses"] and _logged(tmp_path / "short") == short["losses"]
    log.write_text("step,loss\n1,2.0\n")
    with pytest.raises(ResumeError, match=r"losses.csv' holds the losses of 1 steps, but the "
                                          r"checkpoint is at step 23"):
        train_digits(**kw, checkpoint=tmp_path / "short", resume=True)


OLD_CHECKPOINT = os.path.join(os.path.dirname(__file__), "fixtures",
                              "train_checkpoint_before_loss_log.safetensors")
"""A checkpoint written by miniflow before the loss log (commit 3df7358): ``train_digits("mlp",
epochs=2, hidden=8, checkpoint=DIR, checkpoint_every=20)`` stopped right after its save at
step 20; its run record holds the 20 losses."""


def test_a_checkpoint_written_before_the_loss_log_still_resumes(tmp_path):
    """An old-layout file (every loss in its run record, no loss log) resumes, bit-identical to
    an uninterrupted run of today's code; the log is written from its losses, and the next
    checkpoint is of the new, bounded kind. The bit-identity is checked on today's step-20
    state written in the old layout, since the matmul kernels' rounding has changed since
    3df7358 (issue 23: FMA in the leftover columns, the tiny-product kernel), so 3df7358's own
    weights lead to other losses; the file 3df7358 wrote must still resume, its losses first."""
    kw = dict(epochs=2, hidden=8, progress=False, checkpoint_every=20)
    whole = train_digits(**kw, checkpoint=tmp_path / "whole")
    state = _checkpoint_at(kw, 20, tmp_path / "at20")
    state["run"]["losses"] = whole["losses"][:20]          # the layout before the loss log
    (tmp_path / "old").mkdir()
    save(state, tmp_path / "old" / CHECKPOINT_FILE)
    resumed = train_digits(**kw, checkpoint=tmp_path / "old", resume=True)
    assert resumed["resumed_from"] == 20 and resumed["losses"] == whole["losses"]
    assert _logged(tmp_path / "old") == whole["losses"]
    assert_identical(load(tmp_path / "whole" / CHECKPOINT_FILE),
                     load(tmp_path / "old" / CHECKPOINT_FILE))
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / CHECKPOINT_FILE).write_bytes(open(OLD_CHECKPOINT, "rb").read())
    written = load(tmp_path / "main" / CHECKPOINT_FILE)["run"]["losses"]
    assert len(written) == 20
    from_main = train_digits(**kw, checkpoint=tmp_path / "main", resume=True)
    assert from_main["resumed_from"] == 20 and from_main["losses"][:20] == written
    assert len(from_main["losses"]) == len(whole["losses"])
    assert np.isfinite(from_main["losses"]).all()
    assert _logged(tmp_path / "main") == from_main["losses"]


def _checkpoint_at(kw, step, folder):
    """Run ``train_digits(**kw)`` until its checkpoint at ``step`` is written, then stop it
    (an exception raised from the save, after the file is complete); returns that file."""
    import miniflow.serialization as S
    real = S._write_atomic

    class Stop(Exception):
        pass

    def write_then_stop(path, data):
        real(path, data)
        raise Stop

    S._write_atomic = write_then_stop
    try:
        with pytest.raises(Stop):
            train_digits(**kw, checkpoint=folder)
    finally:
        S._write_atomic = real
    ckpt = load(folder / CHECKPOINT_FILE)
    assert ckpt["run"]["step"] == step
    return ckpt


# ------------------------------------------------------------------------- all or nothing
def _parts(hidden=16, seed=0):
    """A model, its optimizer, grad scaler, scheduler and graph, trained 3 steps."""
    mf.manual_seed(seed)
    model = mlp((64, hidden, 10))
    opt = mf.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    graph = TrainGraph(model, opt)
    scaler = mf.amp.GradScaler(init_scale=256.0)
    graph.set_grad_scaler(scaler)
    sched = CosineAnnealingLR(opt, T_max=10)
    r = np.random.default_rng(seed)
    for _ in range(3):
        graph(r.random((8, 64), dtype=np.float32), r.integers(0, 10, 8))
        sched.step()
    return {"model": model, "optimizer": opt, "grad_scaler": scaler, "scheduler": sched,
            "rng": RngState()}


def _state_of(parts) -> dict:
    return {k: v.state_dict() for k, v in parts.items()}


def test_restore_loads_every_part():
    src, dst = _parts(seed=1), _parts(seed=2)
    restore(_state_of(src), **dst)
    assert_identical(_state_of(dst), _state_of(src))


@pytest.mark.parametrize("spoil, error, match", [
    (lambda c, other: c.update(model=other["model"]), ValueError,
     r"checkpoint\['model'\]: load_state_dict: '0.weight' is f32\[16, 64\] in the model but "
     r"float32\[32, 64\] in the state dict"),
    (lambda c, other: c.update(optimizer=other["optimizer"]), ValueError,
     r"checkpoint\['optimizer'\]: SGD.load_state_dict: state\[0\]\['momentum_buffer'\] has shape "
     r"\[32, 64\], expected \[16, 64\]"),
    (lambda c, other: c["grad_scaler"].update(scale=-1.0), ValueError,
     r"checkpoint\['grad_scaler'\]: GradScaler.load_state_dict: scale must be a finite number"),
    (lambda c, other: c["scheduler"].update(T_max=0), ValueError,
     r"checkpoint\['scheduler'\]: CosineAnnealingLR.load_state_dict: T_max must be an integer"),
    (lambda c, other: c.update(rng={"bit_generator": "MT19937"}), ValueError,
     r"checkpoint\['rng'\]: RngState.load_state_dict: not a state of the PCG64 generator"),
    (lambda c, other: c.pop("scheduler"), KeyError,
     r"restore: the checkpoint has no 'scheduler' \(it has \['grad_scaler', 'model', "
     r"'optimizer', 'rng'\]\)"),
])
def test_a_checkpoint_that_does_not_fit_names_the_part_and_changes_nothing(spoil, error, match):
    """Only the last part checked (or one in the middle) is wrong: no part is loaded."""
    dst = _parts(seed=3)
    ckpt, other = _state_of(_parts(seed=4)), _state_of(_parts(hidden=32, seed=5))
    before = _state_of(dst)  # after the others: the generator is global
    spoil(ckpt, other)
    with pytest.raises(error, match=match):
        restore(ckpt, **dst)
    assert_identical(_state_of(dst), before)


# ------------------------------------------------------------------------- the command line
def _cli(args, capsys):
    code = main(["train", "--epochs", "1", "--hidden", "16", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def saved(tmp_path, capsys):
    """A folder with the checkpoint of a finished 1-epoch run (23 updates)."""
    code, _, err = _cli(["--checkpoint", str(tmp_path)], capsys)
    assert code == 0, err
    return tmp_path


def test_a_truncated_checkpoint_is_a_clear_error(saved, capsys):
    path = saved / CHECKPOINT_FILE
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 5000])
    code, _, err = _cli(["--checkpoint", str(saved), "--resume"], capsys)
    assert code == 2 and "is truncated" in err and "tensor '" in err, err


def test_an_edited_checkpoint_names_the_tensor(saved, capsys):
    path = saved / CHECKPOINT_FILE
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40                                    # in the last tensor's data
    path.write_bytes(bytes(data))
    code, _, err = _cli(["--checkpoint", str(saved), "--resume"], capsys)
    assert code == 2 and "does not match its checksum" in err, err
    assert "miniflow train: miniflow.load:" in err and "the data of tensor '" in err


def test_a_checkpoint_of_another_model_names_the_key_and_loads_nothing(saved, capsys):
    """Same settings, but the model part of a larger model: refused before anything is loaded
    (the optimizer part, checked after it, is fine)."""
    ckpt = load(saved / CHECKPOINT_FILE)
    mf.manual_seed(0)
    ckpt["model"] = mlp((64, 24, 10)).state_dict()
    save(ckpt, saved / CHECKPOINT_FILE)
    code, _, err = _cli(["--checkpoint", str(saved), "--resume"], capsys)
    assert code == 2
    assert "checkpoint['model']: load_state_dict: '0.weight' is f32[16, 64] in the model but " \
           "float32[24, 64] in the state dict" in err, err


@pytest.mark.parametrize("args, match", [
    (["--hidden", "24"],
     r"was saved by a run with other settings: --hidden 16 \(this run: --hidden 24\)"),
    (["--lr-schedule", "cosine"],
     r"--lr-schedule constant \(this run: --lr-schedule cosine\)"),
    (["--amp"], r"no --amp \(this run: --amp fp16\)"),       # as options, not True / None
    (["--clip-norm", "1"], r"no --clip-norm \(this run: --clip-norm 1.0\)"),
])
def test_resuming_with_other_settings_names_them(saved, capsys, args, match):
    code = main(["train", "--epochs", "1", "--hidden", "16", *args, "--checkpoint", str(saved),
                 "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and __import__("re").search(match, err), err


def test_resuming_another_models_checkpoint_names_the_model_alone(saved, capsys):
    """A digits checkpoint resumed with ``--model gpt`` listed every setting of both recipes,
    among them "no --amp (this run: no --amp)" (False against None); now the model alone."""
    code = main(["train", "--model", "gpt", "--checkpoint", str(saved), "--resume"])
    err = capsys.readouterr().err
    assert code == 2
    assert "was saved by a run with other settings: --model mlp (this run: --model gpt); " \
           "resume with the same options" in err, err


def test_an_existing_checkpoint_is_not_overwritten_and_nothing_to_resume_is_an_error(
        saved, tmp_path, capsys):
    before = (saved / CHECKPOINT_FILE).read_bytes()
    code, _, err = _cli(["--checkpoint", str(saved)], capsys)
    assert code == 2 and "holds a checkpoint that a new run would overwrite: pass --resume" in err
    assert (saved / CHECKPOINT_FILE).read_bytes() == before
    code, _, err = _cli(["--checkpoint", str(tmp_path / "empty"), "--resume"], capsys)
    assert code == 2 and "nothing to resume:" in err
    assert not (tmp_path / "empty").exists()        # nothing made: no folder, no lock file
    (tmp_path / "a_file").write_text("x")
    code, _, err = _cli(["--checkpoint", str(tmp_path / "a_file")], capsys)
    assert code == 2 and "is a file, not a folder" in err and "Errno" not in err
    under = tmp_path / "a_file" / "run"         # was "[Errno 20] Not a directory: '.../run'"
    code, _, err = _cli(["--checkpoint", str(under)], capsys)
    assert code == 2 and "Errno" not in err
    assert f"checkpoint folder {str(under)!r} cannot be made or written: Not a directory; " \
           "give a writable folder for the run" in err, err
    code, out, err = _cli(["--checkpoint", str(saved), "--resume"], capsys)
    assert code == 0 and "resumed from step 23" in out and "for 0 steps" in out


@pytest.mark.parametrize("args, match", [
    (["--resume"], "--resume needs --checkpoint DIR"),
    (["--accumulate", "3"], "--batch-size 64 must be a multiple of --accumulate 3"),
    (["--accumulate", "0"], "--accumulate: must be an integer >= 1"),
    (["--clip-norm", "0"], "--clip-norm: must be a finite number > 0"),
    (["--lr-schedule", "linear"], "invalid choice: 'linear'"),
    (["--checkpoint-every", "0"], "--checkpoint-every: must be an integer >= 1"),
])
def test_bad_train_options_are_usage_errors(args, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *args])
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_the_schedules_of_the_command_line():
    """The scheduler of each --lr-schedule over 30 updates: its first, middle and last lr."""
    def lrs(name):
        opt = mf.optim.SGD(mlp((4, 2)).parameters(), lr=0.1)
        sched = make_lr_schedule(opt, name, 30)
        out = []
        for _ in range(30):
            out.append(opt.param_groups[0]["lr"])
            if sched is not None:
                sched.step()
        return out
    assert lrs("constant") == [0.1] * 30
    step = lrs("step")
    assert step[0] == step[9] == 0.1 and step[10] == pytest.approx(0.01) \
        and step[29] == pytest.approx(0.001)
    cos = lrs("cosine")
    assert cos[0] == 0.1 and cos[15] == pytest.approx(0.05) and cos[29] < 0.001
    warm = lrs("warmup-cosine")
    assert warm[0] == pytest.approx(0.01) and warm[1] == pytest.approx(0.1)
    assert warm[29] < 0.001 and max(warm) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unknown lr schedule 'linear'; choose one of constant"):
        make_lr_schedule(mf.optim.SGD(mlp((4, 2)).parameters(), lr=0.1), "linear", 30)


def test_epoch_batches_cut_to_whole_micro_batches():
    assert epoch_batches(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert epoch_batches(10, 4, accumulate=4) == [(0, 4), (4, 8)]
    assert epoch_batches(1437, 64, accumulate=2)[-1] == (1408, 1436)


# ------------------------------------------------------------- the folder: lock, Ctrl-C, ddp
@pytest.mark.skipif(os.name != "posix", reason="SIGINT")
def test_a_second_run_on_a_locked_folder_is_refused_and_ctrl_c_saves_one_line(tmp_path, capsys):
    """Issue 22 items 6 and 9. A run holds ``checkpoint.lock`` for its whole length: a second
    run on the folder is refused at once, naming the holder's pid (before: both ran to the end,
    overwriting each other's checkpoint). SIGINT (Ctrl-C) ends the first run between two steps
    with a checkpoint of that step, written atomically, one line on stderr and exit code 130
    (128 + SIGINT), no traceback (before: a 30-line KeyboardInterrupt traceback through the
    save code), as PyTorch's scripts do with ``except KeyboardInterrupt: save; exit``. The
    lock goes with the process: the folder is free afterwards."""
    import time
    args = ["train", "--epochs", "1000", "--hidden", "8", "--no-progress",
            "--checkpoint", str(tmp_path), "--checkpoint-every", "10"]
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    # SIGINT as in a terminal: a shell's background job (`bash .ci/run &`) starts with SIGINT
    # ignored, which its children inherit, and Python then installs no KeyboardInterrupt handler
    child = subprocess.Popen([sys.executable, "-m", "miniflow", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    watchdog = threading.Timer(300, child.kill)
    watchdog.daemon = True
    watchdog.start()
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / CHECKPOINT_FILE).exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
            time.sleep(0.05)
        code = main([*args, "--resume"])
        err = capsys.readouterr().err
        assert code == 2 and f"is in use by another run (pid {child.pid} holds" in err, err
        assert "--checkpoint folder" in err
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 130, err
    lines = [ln for ln in err.decode().splitlines()   # the compile notice is no error
             if not ln.startswith("miniflow: compiling kernels")]
    assert len(lines) == 1 and "Traceback" not in err.decode(), err
    import re
    m = re.fullmatch(r"miniflow train: interrupted at step (\d+); checkpoint (saved|kept) at "
                     r"step (\d+) in '.*checkpoint.safetensors' \(--resume continues it\)",
                     lines[0])       # kept: the interrupt came right after a periodic save
    assert m and m[1] == m[3] and (m[2] == "kept") == (int(m[1]) % 10 == 0), lines
    ckpt = load(tmp_path / CHECKPOINT_FILE)
    assert ckpt["run"]["step"] == int(m[1]) > 0 and len(_logged(tmp_path)) == int(m[1])
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    RunFolder(tmp_path).close()                           # the lock was released


@pytest.mark.skipif(os.name != "posix", reason="SIGTERM")
def test_sigterm_checkpoints_as_ctrl_c_and_exits_143(tmp_path):
    """SIGTERM (``timeout``, ``kill``, a batch system's or ``docker stop``'s first signal) ended
    the run at once, Python's default: the updates since the last periodic checkpoint were lost
    (all of them before the first) and their losses with them. It ends the run between two
    steps as Ctrl-C does, with a checkpoint of that step (a periodic one is kept), one line
    naming the signal, and exit code 143 (128 + SIGTERM)."""
    import re
    import time
    args = ["train", "--epochs", "1000", "--hidden", "8", "--no-progress",
            "--checkpoint", str(tmp_path), "--checkpoint-every", "10"]
    env = {k: v for k, v in os.environ.items() if k != "MINIFLOW_BACKEND"}
    child = subprocess.Popen([sys.executable, "-m", "miniflow", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, text=True)
    watchdog = threading.Timer(300, child.kill)
    watchdog.daemon = True
    watchdog.start()
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / CHECKPOINT_FILE).exists():     # the steps have begun
            assert child.poll() is None and time.monotonic() < deadline, child.stderr.read()
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    lines = [ln for ln in err.splitlines() if not ln.startswith("miniflow: compiling kernels")]
    assert child.returncode == 143 and len(lines) == 1 and "Traceback" not in err, err
    m = re.fullmatch(r"miniflow train: SIGTERM: interrupted at step (\d+); checkpoint (saved|kept) "
                     r"at step (\d+) in '.*checkpoint.safetensors' \(--resume continues it\)",
                     lines[0])       # kept: the signal came right after a periodic save
    assert m and m[1] == m[3] and (m[2] == "kept") == (int(m[1]) % 10 == 0), lines
    assert load(tmp_path / CHECKPOINT_FILE)["run"]["step"] == int(m[1]) > 0
    assert len(_logged(tmp_path)) == int(m[1])
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    RunFolder(tmp_path).close()                           # the lock was released


def test_resume_of_a_run_before_its_first_save_names_the_run_that_holds_the_folder(
        tmp_path, capsys):
    """``--resume`` on the folder of a run still before its first checkpoint said "nothing to
    resume ... train without --resume", which the lock then refused: now it names the run that
    holds the folder; once the lock is released, the old message, and nothing is created."""
    held = RunFolder(tmp_path)          # flock: a second open file conflicts, in one process too
    try:
        code, _, err = _cli(["--checkpoint", str(tmp_path), "--resume"], capsys)
        assert code == 2 and "nothing to resume yet: " in err, err
        assert f"is in use by another run (pid {os.getpid()} holds" in err
        assert "train without --resume" not in err
    finally:
        held.close()
    code, _, err = _cli(["--checkpoint", str(tmp_path), "--resume"], capsys)
    assert code == 2 and "nothing to resume: " in err and "train without --resume" in err, err
    code, _, err = _cli(["--checkpoint", str(tmp_path / "new"), "--resume"], capsys)
    assert code == 2 and not (tmp_path / "new").exists()


def test_save_beside_the_checkpoint_is_refused(tmp_path, capsys):
    """Issue 22 item 6: ``--save DIR/checkpoint.safetensors`` with ``--checkpoint DIR`` would
    replace the training checkpoint with a bare state dict (``--resume`` then fails): a usage
    error, also through another spelling of the path; the log and the lock likewise."""
    for name in (CHECKPOINT_FILE, "./" + LOSS_LOG, "checkpoint.lock"):
        with pytest.raises(SystemExit) as e:
            main(["train", "--checkpoint", str(tmp_path), "--save", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"would replace the run's {os.path.basename(name)}" in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("first, then, match", [
    (["--ddp"], [], r"was saved by a data-parallel run of 1 rank\(s\): resume it with "
                    r"`mpiexec -n 1 miniflow train --ddp \.\.\. --resume`"),
    ([], ["--ddp"], r"was saved by a run without --ddp \(one process, its own data order\): "
                    r"resume it without --ddp"),
])
def test_a_data_parallel_checkpoint_resumes_only_with_ddp(tmp_path, capsys, first, then,
                                                          match):
    """Issue 22 item 8: the data order of a data-parallel run depends on the world size
    (``DistributedSampler``), so its checkpoint resumed in one process without ``--ddp`` is
    refused, naming ``--ddp`` and ``mpiexec -n N`` (before: a crash deep inside, ``mean:
    reducing an empty axis of shape [0]``, or ``--world-size None``), and the reverse too."""
    code, _, err = _cli([*first, "--checkpoint", str(tmp_path), "--checkpoint-every", "10"],
                        capsys)
    assert code == 0, err
    code, _, err = _cli([*then, "--checkpoint", str(tmp_path), "--resume"], capsys)
    assert code == 2 and __import__("re").search(match, err), err
    assert "world-size" not in err
