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
from miniflow import CheckpointError, load, save
from miniflow.checkpoint import restore
from miniflow.cli import main
from miniflow.experiments.mlp import TrainGraph, mlp
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
    assert at_100["run"]["step"] == 100 and len(at_100["run"]["losses"]) == 100
    c = _child([*RUN, "--checkpoint", str(killed), "--resume"])
    out_c, err_c = c.communicate()
    out_a, err_a = a.communicate()
    assert a.returncode == 0 and c.returncode == 0, (err_a, err_c)
    assert b"resumed from step 100" in out_c and b"for 130 steps" in out_c
    final_a, final_c = load(straight / CHECKPOINT_FILE), load(killed / CHECKPOINT_FILE)
    assert final_a["run"]["step"] == 230 and len(final_a["run"]["losses"]) == 230
    assert final_a["grad_scaler"] is not None and final_a["scheduler"] is not None
    assert_identical(final_a, final_c)                   # losses, weights, optimizer, scale ...
    assert final_a["run"]["losses"][:100] == at_100["run"]["losses"]

    def results(out):
        return [ln for ln in out.splitlines() if ln.startswith((b"final loss", b"train acc",
                                                                 b"test acc"))]
    assert len(results(out_a)) == 3 and results(out_a) == results(out_c)


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
    (["--hidden", "24"], r"was saved by a run with other settings: --hidden 16 \(this run: 24\)"),
    (["--lr-schedule", "cosine"],
     r"--lr-schedule 'constant' \(this run: 'cosine'\)"),
])
def test_resuming_with_other_settings_names_them(saved, capsys, args, match):
    code = main(["train", "--epochs", "1", "--hidden", "16", *args, "--checkpoint", str(saved),
                 "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and __import__("re").search(match, err), err


def test_an_existing_checkpoint_is_not_overwritten_and_nothing_to_resume_is_an_error(
        saved, tmp_path, capsys):
    before = (saved / CHECKPOINT_FILE).read_bytes()
    code, _, err = _cli(["--checkpoint", str(saved)], capsys)
    assert code == 2 and "holds a checkpoint that a new run would overwrite: pass --resume" in err
    assert (saved / CHECKPOINT_FILE).read_bytes() == before
    code, _, err = _cli(["--checkpoint", str(tmp_path / "empty"), "--resume"], capsys)
    assert code == 2 and "nothing to resume:" in err
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
