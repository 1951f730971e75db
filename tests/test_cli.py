"""The command line: argument validation and ``info``."""
import pytest

from miniflow.cli import main


@pytest.mark.parametrize("args,match", [
    (["--epochs", "0"], "--epochs: must be an integer >= 1"),
    (["--batch-size", "x"], "--batch-size: must be an integer >= 1"),
    (["--lr", "-1"], "--lr: must be a finite number > 0"),
    (["--momentum", "inf"], "--momentum: must be a finite number >= 0"),
])
def test_train_rejects_bad_arguments_with_a_usage_error(args, match, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", *args])
    assert e.value.code == 2 and match in capsys.readouterr().err


def test_info_prints_backend_and_versions(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "backend: cpu" in out and "numba " in out and "float16 conversion on the CPU" in out
