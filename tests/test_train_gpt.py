"""``miniflow train --model gpt`` (``miniflow.experiments.train_gpt``) on tiny settings: a run
interrupted after a checkpoint and resumed ends bit-identical to the uninterrupted run (dropout
masks included), fp16 AMP trains, the sample is printed, ``--ddp`` on 2 ranks (under
``mpiexec``, skipped without the dist extra) trains as one process on both ranks' windows, and
the CLI's usage errors."""
import numpy as np
import pytest

import miniflow as mf
from miniflow.cli import main
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


def test_fp16_amp_trains_and_sampling_follows_its_arguments():
    r = train_gpt(**{**TINY, "dropout": 0.0}, amp="fp16", report=lambda line: None)
    assert r["scaler"] is not None and np.isfinite(r["losses"]).all()
    rng = np.random.default_rng(0)
    text = generate(r["model"], r["corpus"], "def ", 12, temperature=0.5, top_k=3, rng=rng)
    assert text.startswith("def ") and len(text) == 16
    with pytest.raises(ValueError, match="temperature must be > 0"):
        generate(r["model"], r["corpus"], "x", 1, temperature=0.0)


def test_cli_trains_and_prints_the_sample(capsys):
    code = main(["train", "--model", "gpt", "--epochs", "1", "--steps-per-epoch", "2",
                 "--batch-size", "4", "--block-size", "8", "--sample", "10", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "epoch 1: validation loss" in out and "of the unigram model's" in out
    assert "sample:\ndef " in out


@pytest.mark.parametrize("argv,match", [
    (["--model", "gpt", "--momentum", "0.9"], "trains with AdamW"),
    (["--model", "gpt", "--batch-size", "6", "--accumulate", "4"],
     "--batch-size 6 must be a multiple of --accumulate 4"),
])
def test_cli_usage_errors(argv, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *argv])
    assert e.value.code == 2 and match in capsys.readouterr().err


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
    res = run_cli(2, tmp_path, "train", "--ddp", *args, "--batch-size", 4, "--save", save)
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
