"""``miniflow train --model lenet|resnet18`` on the digits: the command runs (one epoch, the CI
smoke run), LeNet reaches 98% test accuracy in float32 and stays within one point under AMP with
a dynamic loss scale (seconds), and so does ResNet-18 (minutes: ``slow``)."""
import pytest

from miniflow.cli import main
from miniflow.experiments.train import RECIPES, train_digits


def test_train_command_runs_lenet(capsys):
    assert main(["train", "--model", "lenet", "--epochs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "model: lenet, 1 epoch of SGD" in out and "test accuracy:" in out
    assert main(["train", "--model", "lenet", "--epochs", "1", "--amp", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "AMP (float16) with a dynamic loss scale" in out and "loss scale:" in out


def test_train_rejects_an_unknown_model(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--model", "vgg"])
    assert e.value.code == 2 and "invalid choice: 'vgg'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown model 'vgg'; choose one of mlp, lenet, "
                                         "resnet18"):
        train_digits("vgg")


def _fp32_and_amp(model):
    fp32 = train_digits(model, progress=False)
    amp = train_digits(model, amp=True, progress=False)
    return fp32, amp


def test_lenet_reaches_98_percent_and_amp_stays_within_one_point():
    fp32, amp = _fp32_and_amp("lenet")
    assert fp32["test_accuracy"] >= 0.98, fp32["epoch_test_accuracy"]
    assert amp["test_accuracy"] >= fp32["test_accuracy"] - 0.01, amp["epoch_test_accuracy"]
    assert amp["scaler"].scale >= 1.0 and len(fp32["losses"]) == RECIPES["lenet"].epochs * 23
    bn = fp32["model"].bn1
    assert int(bn.num_batches_tracked.item()) == len(fp32["losses"])   # training steps only


@pytest.mark.slow
def test_resnet18_reaches_98_percent_and_amp_stays_within_one_point():
    fp32, amp = _fp32_and_amp("resnet18")
    assert fp32["test_accuracy"] >= 0.98, fp32["epoch_test_accuracy"]
    assert amp["test_accuracy"] >= fp32["test_accuracy"] - 0.01, amp["epoch_test_accuracy"]
