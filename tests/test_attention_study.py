"""``miniflow attention-study`` (``miniflow.experiments.attention_study``) on a few scales: float32
matches float64, AMP's error grows with the score scale and overflows beyond float16's range,
pinning the scores with ``amp_black_identity`` changes nothing (measured), the float32 block
does not overflow; the CLI writes its results and figure."""
import json

import numpy as np
import pytest

from miniflow.cli import main
from miniflow.experiments.attention_study import ir_text, run_variant, study, summary

SCALES = (1.0, 64.0, 131072.0)


def test_float16_softmax_error_grows_and_overflows_and_the_pin_changes_nothing():
    r = study(SCALES, batch=2, length=8, d=8)
    assert all(row["out_error"] < 1e-4 for row in r["fp32"])
    amp = r["amp"]
    assert 1e-5 < amp[0]["out_error"] < amp[1]["out_error"] and amp[2]["nonfinite"]
    assert [x["out_error"] for x in r["amp+black_scores"][:2]] == [x["out_error"]
                                                                    for x in amp[:2]]
    assert not any(x["nonfinite"] for x in r["amp+black_matmul"])
    lines = summary(r, SCALES)
    assert any("no change at all" in line for line in lines)
    assert any("non-finite output from score std 131072" in line for line in lines)


def test_the_ir_under_amp_has_a_float16_softmax():
    text = ir_text("amp")
    assert any("softmax(" in line and "f16" in line.split("=")[0] for line in text.splitlines())
    assert not run_variant("fp32", 1.0, batch=1, length=4, d=4)["nonfinite"]


def test_cli_writes_results_and_figure(tmp_path, capsys):
    assert main(["attention-study", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "softmax between two batch_matmuls" in out and "figure:" in out
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["results"]) == {"fp32", "amp", "amp+black_scores", "amp+black_matmul"}
    assert (tmp_path / "attention_amp.png").stat().st_size > 10_000
    assert np.isfinite([r["out_error"] for r in data["results"]["fp32"]]).all()


def test_cli_refuses_an_out_that_is_a_file_before_the_study(tmp_path, capsys):
    """``--out`` naming a file was a FileExistsError traceback after the whole study."""
    (tmp_path / "f").write_text("x")
    assert main(["attention-study", "--out", str(tmp_path / "f")]) == 2
    assert "cannot write the study's results to" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["results.json", "attention_amp.png"])
def test_cli_refuses_a_folder_where_a_result_file_goes_before_the_study(tmp_path, capsys,
                                                                        monkeypatch, name):
    """A folder named ``results.json`` or ``attention_amp.png`` in ``--out`` ended the study in
    an ``IsADirectoryError`` traceback (matplotlib's, for the figure); it is one line naming
    the file, and exit code 2, before the study runs."""
    from miniflow.experiments import attention_study

    def no_study():
        raise AssertionError("the study ran before its output files were checked")

    monkeypatch.setattr(attention_study, "study", no_study)
    (tmp_path / name).mkdir()
    assert main(["attention-study", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"miniflow attention-study: cannot write the study's results to {str(tmp_path)!r}: "
        f"{name} in it is not a file but a folder (or a device, a FIFO); pass a writable "
        "folder with --out DIR\n")


def test_an_interrupted_write_keeps_the_previous_results_whole(tmp_path, monkeypatch, capsys):
    """``results.json`` was opened with "w" and dumped into: Ctrl-C or a full disk during the
    write left a part of it in place of the previous study's; it is written atomically now
    (the old file or the new one), and the interrupt is one line, exit code 130."""
    import os

    from miniflow.experiments import attention_study
    (tmp_path / "results.json").write_text('{"old": true}')
    monkeypatch.setattr(attention_study, "study", lambda: {"fp32": [{"out_error": 0.0,
                                                                      "nonfinite": False}]})
    monkeypatch.setattr(attention_study, "SCALES", (1.0,))
    monkeypatch.setattr(attention_study, "summary", lambda results: [])

    def interrupted(fd, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "write", interrupted)
    assert main(["attention-study", "--out", str(tmp_path)]) == 130
    assert os.listdir(tmp_path) == ["results.json"]
    assert (tmp_path / "results.json").read_text() == '{"old": true}'
