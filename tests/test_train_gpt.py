"""``miniflow train --model gpt`` (``miniflow.experiments.train_gpt``) on tiny settings: a run
interrupted after a checkpoint and resumed ends bit-identical to the uninterrupted run (dropout
masks included), fp16 AMP trains, the sample is printed, ``--ddp`` on 2 ranks (under
``mpiexec``, skipped without the dist extra) trains as one process on both ranks' windows, and
the CLI's usage errors."""
import math
import os
import random
import re
import signal

import numpy as np
import pytest

import miniflow as mf
from miniflow.amp import NonFiniteGradientsError
from miniflow.cli import main
from miniflow.experiments.interrupts import interrupted_exit
from miniflow.experiments.train import TrainingInterrupted
from miniflow.experiments.train_gpt import generate, train_gpt

from mpi_harness import requires_mpi, run_cli

TINY = dict(epochs=2, steps_per_epoch=3, batch_size=4, block_size=8, n_layer=1, n_head=2,
            n_embd=16, dropout=0.1, eval_batches=2, progress=False)


class _Stop(Exception):
    pass


def _stop_after_first_epoch(line):
    raise _Stop(line)


def test_a_resumed_run_is_bit_identical(tmp_path):
    full = train_gpt(**TINY, report=lambda line: None)
    with pytest.raises(_Stop, match="epoch 1: validation loss"):
        train_gpt(**TINY, checkpoint=tmp_path, checkpoint_every=3,
                  report=_stop_after_first_epoch)
    resumed = train_gpt(**TINY, checkpoint=tmp_path, resume=True, report=lambda line: None)
    assert resumed["resumed_from"] == 3 and resumed["steps"] == 6
    assert resumed["losses"] == full["losses"] and resumed["val_losses"] == full["val_losses"]
    for name, value in full["model"].state_dict().items():
        np.testing.assert_array_equal(resumed["model"].state_dict()[name], value, err_msg=name)


def test_accumulated_micro_batches_give_one_loss_per_update():
    """With ``accumulate`` the graph returns the micro-batches' losses; the run records their
    mean per update (``float()`` of the array crashed: a new user's finding)."""
    r = train_gpt(**TINY, accumulate=2, report=lambda line: None)
    assert len(r["losses"]) == 6 and np.isfinite(r["losses"]).all()


@pytest.mark.skipif(os.name != "posix", reason="SIGINT")
def test_ctrl_c_checkpoints_at_the_update_reached_and_the_resumed_run_is_bit_identical(
        tmp_path):
    """Ctrl-C (SIGINT, here sent by the process to itself after epoch 1) ends the update
    running, checkpoints there and raises ``TrainingInterrupted``, as ``train_digits`` does
    (before: a KeyboardInterrupt traceback and the checkpoint of the last multiple of
    ``checkpoint_every``)."""
    full = train_gpt(**TINY, report=lambda line: None)
    # Python's own SIGINT handler, as in a terminal: a shell's background job (`bash .ci/run &`)
    # starts with SIGINT ignored, and Ctrl-C cannot reach it
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(TrainingInterrupted, match="interrupted at step 3; checkpoint saved "
                                                      "at step 3"):
            train_gpt(**TINY, checkpoint=tmp_path, checkpoint_every=100,
                      report=lambda line: os.kill(os.getpid(), signal.SIGINT))
    finally:
        signal.signal(signal.SIGINT, previous)
    resumed = train_gpt(**TINY, checkpoint=tmp_path, resume=True, report=lambda line: None)
    assert resumed["resumed_from"] == 3 and resumed["losses"] == full["losses"]


@pytest.mark.skipif(os.name != "posix", reason="SIGTERM")
def test_sigterm_checkpoints_as_ctrl_c_and_the_command_exits_143(tmp_path, capsys):
    """SIGTERM (``timeout -s TERM``, a batch system's first signal) ended the process at once,
    losing the updates since the last periodic checkpoint; it stops as Ctrl-C does, with a
    checkpoint at the update reached, and ``miniflow train`` ends with one line naming the
    signal and exit code 143 (128 + SIGTERM). The handler is gone after the run."""
    full = train_gpt(**TINY, report=lambda line: None)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(TrainingInterrupted, match="interrupted at step 3; checkpoint saved "
                                                      "at step 3") as info:
            train_gpt(**TINY, checkpoint=tmp_path, checkpoint_every=100,
                      report=lambda line: os.kill(os.getpid(), signal.SIGTERM))
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert info.value.signum == signal.SIGTERM
    assert interrupted_exit("train", info.value) == 143
    assert capsys.readouterr().err.startswith("miniflow train: SIGTERM: interrupted at step 3;")
    resumed = train_gpt(**TINY, checkpoint=tmp_path, resume=True, report=lambda line: None)
    assert resumed["resumed_from"] == 3 and resumed["losses"] == full["losses"]


def test_logdir_logs_the_updates_and_validation_losses(tmp_path):
    pytest.importorskip("tensorboardX")
    from test_logging import read_scalars
    r = train_gpt(**TINY, amp="bf16", logdir=tmp_path, report=lambda line: None)
    assert r["logdir"] == str(tmp_path / "gpt-bf16-lr0.003-warmup-cosine-bs4-ctx8-L1-H2-E16-ep2"
                                         "-spe3-drop0.1-seed0")
    got = read_scalars(r["logdir"])
    assert [v for _, v in got["train/loss"]] == pytest.approx(r["losses"], rel=1e-6)
    assert [s for s, _ in got["eval/validation_loss"]] == [3, 6]
    assert [v for _, v in got["eval/validation_loss"]] == pytest.approx(r["val_losses"], rel=1e-6)


def test_fp16_amp_trains_and_sampling_follows_its_arguments():
    r = train_gpt(**{**TINY, "dropout": 0.0}, amp="fp16", report=lambda line: None)
    assert r["scaler"] is not None and np.isfinite(r["losses"]).all()
    rng = np.random.default_rng(0)
    text = generate(r["model"], r["corpus"], "def ", 12, temperature=0.5, top_k=3, rng=rng)
    assert text.startswith("def ") and len(text) == 16
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        generate(r["model"], r["corpus"], "x", 1, temperature=0.0)
    # a new user's edges: the command line refused inf and the API took it; an empty prompt, a
    # float or bool top_k were NumPy errors (or top 1); a tiny temperature gave NaN probabilities
    for temperature in (math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
            generate(r["model"], r["corpus"], "x", 1, temperature=temperature)
    for length in (-5, 2.5, True):      # -5 returned the prompt, 2.5 a TypeError of range()
        with pytest.raises(ValueError, match="length must be an int >= 0"):
            generate(r["model"], r["corpus"], "x", length)
    for top_k in (2.5, True, 0):
        with pytest.raises(ValueError, match="top_k must be an int >= 1"):
            generate(r["model"], r["corpus"], "x", 1, top_k=top_k)
    with pytest.raises(ValueError, match="the prompt is empty"):
        generate(r["model"], r["corpus"], "", 1)
    for prompt in (None, b"def "):      # None said "the prompt is empty", bytes an AttributeError
        with pytest.raises(TypeError, match=r"generate: prompt must be a str \(the text to "
                                            rf"continue\), got {type(prompt).__name__}"):
            generate(r["model"], r["corpus"], prompt, 1)
    greedy = generate(r["model"], r["corpus"], "def ", 6, top_k=1, rng=np.random.default_rng(1))
    assert generate(r["model"], r["corpus"], "def ", 6, temperature=1e-310,
                    rng=np.random.default_rng(2)) == greedy      # argmax, not NaN


def test_generate_takes_a_seed_or_a_generator_and_names_any_other_rng():
    """``rng=0`` (a seed, as NumPy's default_rng and scikit-learn's random_state take one) was
    "'int' object has no attribute 'choice'" after the first forward; a seed draws as
    ``np.random.default_rng(seed)`` does, anything else is refused before the model runs."""
    from miniflow.data import stdlib_text
    corpus = stdlib_text()
    model = mf.models.gpt(corpus.vocab_size, 8, 1, 2, 16)
    want = generate(model, corpus, "def ", 8, rng=np.random.default_rng(7))
    assert generate(model, corpus, "def ", 8, rng=7) == want
    assert generate(model, corpus, "def ", 8, rng=np.int64(7)) == want
    for bad in (1.5, "7", True, -1, random.Random(0)):
        with pytest.raises(TypeError, match=r"generate: rng must be None \(miniflow's "
                                            r"generator\), a seed \(an int >= 0\) or a "
                                            r"numpy\.random\.Generator, got "):
            generate(model, corpus, "def ", 8, rng=bad)


def test_a_diverged_run_prints_its_results_and_one_line_instead_of_a_sample(capsys):
    """An lr that drives the weights to NaN ended with NumPy's "Probabilities contain NaN" as
    exit code 2 (a usage error), the run's results unprinted; now the results, then one line
    saying why there is no sample, exit code 1 (``generate`` refuses non-finite logits)."""
    r = train_gpt(**{**TINY, "dropout": 0.0}, lr=1e30, sample=5, report=lambda line: None)
    assert r["sample"] is None and "logits are not finite" in r["sample_error"]
    with pytest.raises(FloatingPointError, match="nothing to sample from"):
        generate(r["model"], r["corpus"], "def ", 1)
    code = main(["train", "--model", "gpt", "--epochs", "1", "--steps-per-epoch", "2",
                 "--batch-size", "4", "--block-size", "8", "--lr", "1e30", "--sample", "5",
                 "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 1 and "validation loss: nan nats/char" in out and "sample:" not in out
    assert err.startswith("miniflow train: no sample: generate: the model's logits are not "
                          "finite") and "smaller --lr" in err and "Probabilities" not in err


def test_cli_under_fp16_amp_prints_the_loss_scale_and_skipped_steps(capsys):
    """The digits models printed the grad scaler's end state under ``--amp``, the GPT did not
    (its AMP run said nothing of skipped steps); now both print the same line."""
    tiny = ["--epochs", "1", "--steps-per-epoch", "2", "--batch-size", "4", "--block-size", "8",
            "--sample", "0", "--no-progress"]
    assert main(["train", "--model", "gpt", "--amp", *tiny]) == 0
    assert "\nloss scale: 65536 at the end, 0 steps skipped\n" in capsys.readouterr().out
    assert main(["train", "--model", "gpt", "--amp", "bf16", *tiny]) == 0
    assert "loss scale" not in capsys.readouterr().out         # bf16: no loss scaling


def test_cli_model_line_names_accumulation_and_clipping(capsys):
    """The GPT's model line said ``batch 4`` whatever ``--accumulate`` and ``--clip-norm`` were
    (a learner could not see them applied); now as the digits models' line says them."""
    assert main(["train", "--model", "gpt", "--epochs", "1", "--steps-per-epoch", "2",
                 "--batch-size", "4", "--block-size", "8", "--accumulate", "2", "--clip-norm",
                 "0.5", "--sample", "0", "--no-progress"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("model:"))
    assert line.endswith("weight decay 0.1, batch 4 as 2 accumulated micro-batches of 2, "
                         "gradients clipped to an L2 norm of 0.5), float32"), line


def test_cli_trains_and_prints_the_sample(capsys):
    code = main(["train", "--model", "gpt", "--epochs", "1", "--steps-per-epoch", "2",
                 "--batch-size", "4", "--block-size", "8", "--sample", "10", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "epoch 1: validation loss" in out and "of the unigram model's" in out
    assert "sample:\ndef " in out


@pytest.mark.parametrize("argv,match", [
    (["--model", "gpt", "--momentum", "0.9"], "trains with AdamW"),
    (["--sample", "5"], "--sample is an option of --model gpt; --model mlp does not read it"),
    (["--model", "lenet", "--top-k", "3"], "--top-k is an option of --model gpt"),
    (["--model", "gpt", "--save", ""], "--save needs a path, got an empty one"),
    (["--model", "gpt", "--checkpoint", "new", "--save", "new"],
     "--save new would replace the run's folder itself in --checkpoint new"),
    (["--model", "gpt", "--batch-size", "6", "--accumulate", "4"],
     "--batch-size 6 must be a multiple of --accumulate 4"),
])
def test_cli_usage_errors(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *argv])
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_cli_checks_save_before_training_and_a_diverged_run_is_one_line(tmp_path, capsys,
                                                                          monkeypatch):
    """``--save`` into a missing folder is refused before the first update (it trained the
    whole run, then failed); a run whose gradients stay non-finite, or that runs out of memory,
    ends with one line and exit code 1, not a traceback; a context longer than the text is exit
    code 2."""
    code = main(["train", "--model", "gpt", "--save", str(tmp_path / "no" / "m.safetensors")])
    assert code == 2 and "--save" in capsys.readouterr().err
    import miniflow.experiments.train_gpt as module

    def diverged(**kwargs):
        raise NonFiniteGradientsError("64 consecutive steps skipped")
    monkeypatch.setattr(module, "train_gpt", diverged)
    assert main(["train", "--model", "gpt", "--no-progress"]) == 1
    assert "miniflow train: 64 consecutive steps skipped" in capsys.readouterr().err
    monkeypatch.setattr(module, "train_gpt", lambda **kwargs: np.empty(1 << 62, np.int8))
    assert main(["train", "--model", "gpt", "--no-progress"]) == 1
    assert "out of memory (Unable to allocate" in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["train", "--model", "gpt", "--block-size", "30000000", "--no-progress"]) == 2
    assert "block_size 30000000 is longer than the text" in capsys.readouterr().err


@pytest.mark.slow
@requires_mpi
def test_ddp_on_two_ranks_is_one_process_on_both_ranks_windows(tmp_path):
    """``mpiexec -n 2 miniflow train --model gpt --ddp --batch-size 4``: rank 0 alone reports
    and saves; every step averages the gradients of the two ranks' 4 windows, which are rows
    0-3 and 4-7 of the 8 windows one process draws with ``--batch-size 8``: the weights end as
    that process's, up to the order of float32 sums: AdamW divides by the root of the second
    moment, so an element whose gradient is near zero can move by up to a step (lr) where the
    rounding differs; all but a few elements agree to 1e-5."""
    save = tmp_path / "gpt.safetensors"
    args = ["--model", "gpt", "--epochs", "1", "--steps-per-epoch", "4", "--block-size", "8",
            "--sample", "12", "--no-progress"]
    res = run_cli(2, tmp_path, "train", "--ddp", *args, "--batch-size", 4, "--save", save,
                  "--checkpoint", tmp_path / "run")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.count("epoch 1: validation loss") == 1 and out.count("sample:") == 1, out
    assert "data parallel: world size 2, batch 4 per rank (8 per step), 1 thread(s) per rank" \
        in out
    one = train_gpt(epochs=1, steps_per_epoch=4, block_size=8, batch_size=8, progress=False,
                    report=lambda line: None)
    got = mf.load(str(save))
    diff = np.concatenate([np.abs(got[name] - value).ravel()
                           for name, value in one["model"].state_dict().items()])
    assert diff.max() < 3e-3 and np.mean(diff > 1e-5) < 1e-3, (diff.max(), np.mean(diff > 1e-5))
    # the validation loss is scored on the step's 8 windows, as that process scores it (it was
    # scored on rank 0's 4: 3.4770 against 3.4697 in a 10-step run of batch 32)
    [printed] = re.findall(r"epoch 1: validation loss (\d+\.\d+)", out)
    assert abs(float(printed) - one["val_losses"][-1]) < 1e-3, (printed, one["val_losses"])
    # and losses.csv holds the mean of the ranks' losses, the whole batch's (it held rank 0's)
    [csv] = (tmp_path / "run").rglob("losses.csv")
    logged = [float(line.split(",")[1]) for line in csv.read_text().splitlines()[1:]]
    np.testing.assert_allclose(logged, one["losses"], atol=1e-4)


@pytest.mark.parametrize("option", [dict(epochs=0), dict(steps_per_epoch=0), dict(n_head=-1),
                                    dict(accumulate=0), dict(eval_batches=0)])
def test_a_size_or_count_that_is_not_a_positive_integer_is_named(option):
    """``epochs=0`` or ``steps_per_epoch=0`` trained 0 steps and sampled from the untrained
    model, silently (the CLI refuses them; the Python API now names them too)."""
    (name, value), = option.items()
    with pytest.raises(ValueError, match=rf"train_gpt: {name} must be a positive integer, "
                                         rf"got {value!r}"):
        train_gpt(progress=False, **option)


def test_resuming_with_other_model_sizes_names_them_as_keyword_arguments(tmp_path):
    """``n_layer`` and ``eval_batches`` have no ``miniflow train`` option: a resume with other
    values named ``--n-layer 1 (this run: --n-layer 2)``, options that do not exist."""
    train_gpt(**TINY, checkpoint=tmp_path, report=lambda line: None)
    with pytest.raises(ValueError, match=r"other settings: n_layer=1 \(this run: n_layer=2\); "
                                         r"eval_batches=2 \(this run: eval_batches=3\)"):
        train_gpt(**{**TINY, "n_layer": 2, "eval_batches": 3}, checkpoint=tmp_path,
                  resume=True, report=lambda line: None)


def test_gpt_generate_is_nanogpts_greedy_cropped_and_seeded():
    """nanoGPT's ``model.generate(idx, max_new_tokens, temperature=1.0, top_k=None)`` was
    missing on the GPT model: an int64 ``[B, T + max_new_tokens]`` tensor, idx kept in front;
    ``top_k=1`` takes the argmax of the eager forward's last logits, the context cropped to
    ``block_size`` (here the sequence outgrows it); the same draws after the same
    ``manual_seed``; the forward runs with gradients off (``torch.no_grad``)."""
    mf.manual_seed(0)
    model = mf.models.gpt(11, block_size=6, n_layer=1, n_head=2, n_embd=16).eval()
    idx = mf.tensor(np.array([[1, 2, 3], [4, 5, 6]], np.int64))
    out = model.generate(idx, 5, top_k=1)
    assert out.dtype is mf.int64 and out.shape == (2, 8)
    ids = out.numpy()
    np.testing.assert_array_equal(ids[:, :3], idx.numpy())
    for t in range(3, 8):
        want = model(mf.tensor(ids[:, max(0, t - 6):t])).numpy()[:, -1].argmax(-1)
        np.testing.assert_array_equal(ids[:, t], want)
    draws = []
    for _ in range(2):
        mf.manual_seed(5)
        draws.append(model.generate(idx.numpy(), 7, temperature=0.8, top_k=4).numpy())
    np.testing.assert_array_equal(draws[0], draws[1])
    assert draws[0].shape == (2, 10) and ((draws[0] >= 0) & (draws[0] < 11)).all()
    np.testing.assert_array_equal(model.generate(idx, 0).numpy(), idx.numpy())
    seen, forward = [], model.forward
    model.forward = lambda x: (seen.append(mf.is_grad_enabled()), forward(x))[1]
    model.generate(idx, 2)
    assert seen == [False, False] and mf.is_grad_enabled()
    with pytest.raises(ValueError, match=r"generate: max_new_tokens must be an int >= 0"):
        model.generate(idx, -1)
    with pytest.raises(ValueError, match=r"generate: temperature must be a finite number > 0"):
        model.generate(idx, 1, temperature=0.0)
    with pytest.raises(ValueError, match=r"generate: idx must be \[batch, time\] integer token "
                                         r"ids with time >= 1, got int64 of shape \[3\]"):
        model.generate(np.array([1, 2, 3]), 1)
