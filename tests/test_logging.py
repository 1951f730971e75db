"""TensorBoard scalars (``miniflow.logging``, the ``tensorboard`` extra; ``miniflow train
--logdir``): the event files read back with TensorBoard's own ``EventAccumulator`` hold the
values training computed and printed.

Followed: PyTorch's ``test/test_tensorboard.py`` (write with ``SummaryWriter``, read the event
file back and compare); the gradient norm is checked against ``miniflow.ir.evaluate``, the
float64 reference interpreter, and its rule is ``torch.nn.utils.clip_grad_norm_``'s total norm.
"""
import os
import re
import sys

import numpy as np
import pytest

import miniflow
from miniflow import optim
from miniflow.amp import GradScaler
from miniflow.cli import main
from miniflow.experiments.mlp import TrainGraph, mlp
from miniflow.experiments.train import train_digits
from miniflow.extras import MissingExtraError
from miniflow.ir import evaluate

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
tb_log = pytest.importorskip("miniflow.logging")


def read_scalars(run_dir) -> dict:
    """``{tag: [(step, value), ...]}`` of a run folder's event files."""
    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _batch(seed: int):
    r = np.random.default_rng(seed)
    return r.standard_normal((16, 8)).astype(np.float32), r.integers(0, 4, 16)


def test_two_lines_log_loss_lr_and_the_gradient_norm_of_each_step(tmp_path):
    miniflow.manual_seed(0)
    model = mlp((8, 16, 4))
    graph = TrainGraph(model, optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    log = tb_log.TrainingLog(tmp_path, graph)
    losses, norms = [], []
    for step in range(3):
        x, y = _batch(step)
        ref = evaluate(graph.lower(x, y, after="autograd"), [x, y])   # before the update
        norms.append(np.sqrt(sum(np.sum(g ** 2) for k, g in ref.items() if k.startswith("grad:"))))
        loss = graph(x, y)
        log.step(loss)
        losses.append(float(loss))
    log.epoch(test_accuracy=0.5)
    log.close()
    got = read_scalars(tmp_path / "TrainGraph")
    assert [s for s, _ in got["train/loss"]] == [1, 2, 3]
    np.testing.assert_array_equal([v for _, v in got["train/loss"]], np.float32(losses))
    np.testing.assert_allclose([v for _, v in got["train/grad_norm"]], norms, rtol=1e-5)
    assert [v for _, v in got["train/lr"]] == [np.float32(0.05)] * 3
    assert got["eval/test_accuracy"] == [(3, 0.5)] and "amp/loss_scale" not in got


@pytest.mark.parametrize("groups", [1, 2])
def test_the_gradient_norm_is_the_one_before_clipping(tmp_path, groups):
    """With ``clip_grad_max_norm`` set (in one or two param groups, each clipped by its own
    norm), ``train/grad_norm`` is the norm of the gradients before clipping, as
    ``clip_grad_norm_`` returns it (it was the clipped norm: every step exactly the max norm)."""
    miniflow.manual_seed(0)
    model = mlp((8, 16, 4))
    params = list(model.parameters())
    split = [params] if groups == 1 else [params[:2], params[2:]]
    opt = optim.SGD([{"params": p, "clip_grad_max_norm": 0.05} for p in split], lr=0.05)
    graph = TrainGraph(model, opt)
    norms = []
    with tb_log.TrainingLog(tmp_path, graph, run="clip") as log:
        for step in range(3):
            x, y = _batch(step)
            ref = evaluate(graph.lower(x, y, after="autograd"), [x, y])
            norms.append(np.sqrt(sum(np.sum(g ** 2) for k, g in ref.items()
                                     if k.startswith("grad:"))))
            log.step(graph(x, y))
    got = [v for _, v in read_scalars(tmp_path / "clip")["train/grad_norm"]]
    assert min(norms) > 0.1
    np.testing.assert_allclose(got, norms, rtol=1e-5)


def test_flush_puts_every_event_on_disk_before_the_writer_closes(tmp_path):
    """What a run killed after a checkpoint leaves: every event logged before ``flush()``
    (tensorboardX's own flush left those its writer thread had not written yet: a resumed run's
    log had a hole up to the checkpoint), then more events after it, in the same run."""
    writer = tb_log.ScalarWriter(tmp_path / "r")
    for step in range(1, 201):
        writer.add(step, {"train/loss": step / 2})
    writer.flush()
    assert [s for s, _ in read_scalars(tmp_path / "r")["train/loss"]] == list(range(1, 201))
    writer.add(201, {"train/loss": 0.5})
    writer.close()
    got = read_scalars(tmp_path / "r")["train/loss"]
    assert [s for s, _ in got] == list(range(1, 202)) and got[-1][1] == 0.5


def test_loss_scale_and_skips_follow_the_scaler(tmp_path):
    miniflow.manual_seed(1)
    model = mlp((8, 16, 4))
    graph = TrainGraph(model, optim.SGD(model.parameters(), lr=0.05))
    graph.config.enable_amp(True)
    graph.config.enable_fused_model_update_cast(False)
    graph.set_grad_scaler(GradScaler(init_scale=2.0 ** 24))   # float16 grads overflow at first
    with tb_log.TrainingLog(tmp_path, graph, run="amp") as log:
        scales, skipped = [], []
        for step in range(12):
            scales.append(graph.grad_scaler.scale)
            log.step(graph(*_batch(step)))
            skipped.append(graph.grad_scaler.num_skipped_steps)
    got = read_scalars(tmp_path / "amp")
    assert [v for _, v in got["amp/loss_scale"]] == scales
    assert [v for _, v in got["amp/skipped_steps"]] == skipped and 0 < skipped[-1] < 12
    norms = [v for _, v in got["train/grad_norm"]]
    assert all(np.isfinite(n) == (a == b) for n, a, b in zip(norms, [0] + skipped, skipped))


def test_fused_update_cast_gradients_are_refused_for_the_norm(tmp_path):
    """Refused when the log is made, before its run folder (an empty ``TrainGraph`` folder was
    left behind and the next run became ``TrainGraph-2``), and at the step when the fusion is
    switched on after the log was made."""
    model = mlp((8, 4))
    graph = TrainGraph(model, optim.SGD(model.parameters(), lr=0.05))
    graph.config.enable_amp(True)
    graph.set_grad_scaler(GradScaler())
    loss = graph(*_batch(0))
    with pytest.raises(ValueError, match=r"TrainingLog: .*enable_fused_model_update_cast\(False\) "
                                         r"before making the log.*grad_norm=False"):
        tb_log.TrainingLog(tmp_path, graph)
    assert os.listdir(tmp_path) == []
    with tb_log.TrainingLog(tmp_path, graph, grad_norm=False) as log:
        assert set(log.step(loss)) == {"train/loss", "train/lr", "amp/loss_scale",
                                       "amp/skipped_steps"}
        assert log.path.endswith("TrainGraph")
    graph.config.enable_fused_model_update_cast(False)
    with tb_log.TrainingLog(tmp_path, graph) as log:
        assert log.path.endswith("TrainGraph-2")   # a new run never joins an old one
        graph.config.enable_fused_model_update_cast(True)
        with pytest.raises(ValueError, match=r"enable_fused_model_update_cast\(False\)"):
            log.step(graph(*_batch(1)))


def test_a_resumed_run_continues_its_own_folder(tmp_path):
    model = mlp((8, 4))
    graph = TrainGraph(model, optim.SGD(model.parameters(), lr=0.05))
    with tb_log.TrainingLog(tmp_path, graph, run="r", grad_norm=False) as log:
        for step in range(4):
            log.step(graph(*_batch(step)))
    with tb_log.TrainingLog(tmp_path, graph, run="r", grad_norm=False, resume_step=2) as log:
        log.step(graph(*_batch(9)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
    assert [s for s, _ in read_scalars(tmp_path / "r")["train/loss"]] == [1, 2, 3]


def test_without_the_tensorboard_extra_logging_names_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(MissingExtraError, match=r'pip install -e "\.\[tensorboard\]"'):
        tb_log.ScalarWriter(tmp_path)
    assert main(["train", "--epochs", "1", "--no-progress", "--logdir", str(tmp_path)]) == 2
    assert 'pip install -e ".[tensorboard]"' in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)         # the study refuses before it makes a folder
    assert main(["stability", "--quick", "--logdir", "runs"]) == 2
    assert 'pip install -e ".[tensorboard]"' in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_a_logdir_that_is_a_file_is_one_line_naming_logdir_before_training(model, tmp_path,
                                                                             capsys, monkeypatch):
    """``--logdir`` at a file (or under one) was ``[Errno 20] Not a directory: ...`` after the
    model was made, naming no option; now one line naming ``--logdir``, before any step."""
    import miniflow.experiments.train as digits
    import miniflow.experiments.train_gpt as gpt

    def trained(**kwargs):
        raise AssertionError("trained before --logdir was checked")
    monkeypatch.setattr(digits, "train_digits", trained)
    monkeypatch.setattr(gpt, "train_gpt", trained)
    file = tmp_path / "file"
    file.write_text("")
    for logdir in (file, file / "runs"):
        assert main(["train", "--model", model, "--epochs", "1", "--no-progress",
                     "--logdir", str(logdir)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"miniflow train: cannot write TensorBoard's logs to "
                              f"'{logdir}': ") and "--logdir DIR" in err, err
        assert "Errno" not in err and "Traceback" not in err


@pytest.mark.parametrize("loss", [None, "0.5", np.zeros(0, np.float32)], ids=["None", "str",
                                                                               "empty"])
def test_a_step_without_a_loss_is_refused_by_name(loss, tmp_path):
    model = mlp((8, 4))
    graph = TrainGraph(model, optim.SGD(model.parameters(), lr=0.05))
    with tb_log.TrainingLog(tmp_path, graph, grad_norm=False) as log:
        with pytest.raises((TypeError, ValueError), match="TrainingLog.step: .*loss"):
            log.step(loss)
        assert log.step(graph(*_batch(0)))["train/loss"] > 0     # a real loss still logs


def test_logging_keeps_the_training_bit_for_bit(tmp_path):
    plain = train_digits("mlp", epochs=1, amp=True, progress=False)
    logged = train_digits("mlp", epochs=1, amp=True, progress=False, logdir=tmp_path)
    assert logged["losses"] == plain["losses"]
    assert logged["test_accuracy"] == plain["test_accuracy"]


def test_a_run_writes_one_event_file_flushed_per_epoch(tmp_path, monkeypatch):
    """``TrainingLog.epoch`` (and the flush after each checkpoint) closed the event file and
    opened a new one: a 3-epoch run with checkpoints every 10 steps left 11 files in its run
    folder. As PyTorch's ``SummaryWriter`` (one writer per run, flushed, closed at the end), the
    run writes one file, which alone holds every scalar of the run; each epoch's flush puts it
    on disk."""
    flushed = []

    class Log(tb_log.TrainingLog):
        def epoch(self, **scalars):
            values = super().epoch(**scalars)
            files = os.listdir(self.path)
            flushed.append((files, read_scalars(os.path.join(self.path, files[0]))))
            return values

    monkeypatch.setattr(tb_log, "TrainingLog", Log)
    r = train_digits("mlp", epochs=3, hidden=16, progress=False, logdir=tmp_path / "runs",
                     checkpoint=tmp_path / "ck", checkpoint_every=10)
    files = os.listdir(r["logdir"])
    assert len(files) == 1 and files[0].startswith("events.out.tfevents.")
    got = read_scalars(os.path.join(r["logdir"], files[0]))    # that file alone
    assert [s for s, _ in got["train/loss"]] == list(range(1, 70))    # 3 epochs of 23
    assert [v for _, v in got["train/loss"]] == pytest.approx(r["losses"], rel=1e-6)
    assert [s for s, _ in got["eval/test_accuracy"]] == [23, 46, 69]
    assert len(got["train/lr"]) == len(got["train/grad_norm"]) == 69
    assert [f for f, _ in flushed] == [files] * 3
    assert [len(g["train/loss"]) for _, g in flushed] == [23, 46, 69]


def _printed(pattern: str, text: str) -> float:
    return float(re.search(pattern, text).group(1))


@pytest.mark.slow
def test_train_logdir_logs_what_train_prints_one_run_per_configuration(tmp_path, capsys):
    for amp in (["--amp"], []):
        assert main(["train", "--epochs", "2", "--no-progress", "--logdir", str(tmp_path)]
                    + amp) == 0
        out = capsys.readouterr().out
        run = re.search(r"TensorBoard run: (\S+)", out).group(1)
        got = read_scalars(run)
        assert len(got["train/loss"]) == 46   # 2 epochs of 23 batches
        assert abs(got["train/loss"][-1][1] - _printed(r"final loss: ([\d.]+)", out)) <= 5e-5
        accuracy = _printed(r"test accuracy: ([\d.]+)%", out)
        assert [s for s, _ in got["eval/test_accuracy"]] == [23, 46]
        assert abs(100 * got["eval/test_accuracy"][-1][1] - accuracy) <= 5e-3
        assert {v for _, v in got["train/lr"]} == {np.float32(0.1)}
        assert all(np.isfinite(v) and v > 0 for _, v in got["train/grad_norm"])
        if amp:
            scale = _printed(r"loss scale: ([\d.e+]+) at the end", out)
            skipped = _printed(r"at the end, (\d+) steps skipped", out)
            scales = [v for _, v in got["amp/loss_scale"]]
            counts = [0] + [v for _, v in got["amp/skipped_steps"]]
            assert counts[-1] == skipped and scales[0] == 2.0 ** 16
            for k in range(len(scales)):   # halved after each skip, no growth in 46 steps
                after = scales[k] / 2 if counts[k + 1] > counts[k] else scales[k]
                assert after == (scales[k + 1] if k + 1 < len(scales) else scale)
        else:
            assert "amp/loss_scale" not in got
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mlp-amp-lr0.1-constant-bs64-ep2-seed0", "mlp-fp32-lr0.1-constant-bs64-ep2-seed0"]


def test_the_printed_tensorboard_command_quotes_a_logdir_with_a_space(tmp_path, capsys):
    """``--logdir "my runs"`` printed ``(tensorboard --logdir .../my runs)``, which pasted into
    a shell starts TensorBoard on ``.../my`` (and an argument ``runs``); the path is quoted."""
    import shlex
    logdir = tmp_path / "my runs"
    assert main(["train", "--epochs", "1", "--hidden", "8", "--no-progress", "--logdir",
                 str(logdir)]) == 0
    out = capsys.readouterr().out
    command = re.search(r"^TensorBoard run: .* \((tensorboard --logdir .*)\)$", out, re.M)[1]
    assert shlex.split(command) == ["tensorboard", "--logdir", str(logdir)]


@pytest.mark.slow
def test_a_resumed_run_continues_its_own_tensorboard_run(tmp_path, capsys, monkeypatch):
    """Two runs of one configuration in one logdir write ``name`` and ``name-2``; resuming the
    second continues ``name-2``, which its checkpoint names (it wrote into the first's folder,
    hiding the first's events from its purge step on)."""
    monkeypatch.chdir(tmp_path)
    runs = []
    for extra in (["--checkpoint", "ckP"], ["--checkpoint", "ckQ"],
                  ["--checkpoint", "ckQ", "--resume"]):
        assert main(["train", "--epochs", "1", "--no-progress", "--logdir", "runs", *extra]) == 0
        runs.append(re.search(r"TensorBoard run: (\S+)", capsys.readouterr().out).group(1))
    assert runs[1] == runs[0] + "-2" and runs[2] == runs[1]
    assert len(read_scalars(runs[0])["train/loss"]) == 23


def test_a_value_that_is_no_number_is_refused_naming_its_tag(tmp_path):
    """``log.epoch(accuracy="high")`` was float()'s ValueError, naming neither the tag nor the
    rule, and an array of several values NumPy's TypeError; both name the tag now, and log
    nothing. One number in an array or Tensor is taken."""
    writer = tb_log.ScalarWriter(tmp_path / "r")
    for bad in ("high", np.array([0.1, 0.2]), 1j):
        with pytest.raises(TypeError, match=r"^miniflow.logging: eval/accuracy must be a real "
                                            r"number \(or an array of one\), got "):
            writer.add(1, {"train/loss": 0.5, "eval/accuracy": bad})
    writer.add(1, {"eval/accuracy": np.array([0.25]), "train/loss": miniflow.tensor(0.5),
                   "train/lr": np.float32(0.1), "amp/skipped_steps": 3})
    writer.close()
    assert read_scalars(tmp_path / "r") == {"eval/accuracy": [(1, 0.25)], "train/loss": [(1, 0.5)],
                                            "train/lr": [(1, np.float32(0.1))],
                                            "amp/skipped_steps": [(1, 3.0)]}


def test_logging_after_close_opens_a_new_event_file_as_summarywriter_does(tmp_path):
    """After ``close()`` a ``log.step`` ended in ``AttributeError: 'NoneType' object has no
    attribute 'file_writer'``; it opens a new event file in the same run, as tensorboardX's and
    PyTorch's ``SummaryWriter`` reopen theirs."""
    miniflow.manual_seed(0)
    model = mlp((8, 16, 4))
    graph = TrainGraph(model, optim.SGD(model.parameters(), lr=0.05))
    log = tb_log.TrainingLog(tmp_path, graph)
    log.step(graph(*_batch(0)))
    log.close()
    log.step(graph(*_batch(1)))
    log.close()
    assert [s for s, _ in read_scalars(tmp_path / "TrainGraph")["train/loss"]] == [1, 2]


def test_a_graph_without_an_optimizer_is_refused_for_the_gradient_norm(tmp_path):
    """``TrainingLog(logdir, eval_graph)`` made its run folder, then every ``log.step`` said "no
    training step has run yet", however many calls had run; it is refused when the log is made
    (before its folder), naming what to give, and ``grad_norm=False`` logs the loss alone."""
    from miniflow.experiments.mlp import EvalGraph
    graph = EvalGraph(mlp((8, 16, 4)))
    with pytest.raises(ValueError, match=r"^TrainingLog: EvalGraph has no optimizer, so it has "
                                         r"no gradients to take the norm of; .*grad_norm=False"):
        tb_log.TrainingLog(tmp_path, graph)
    assert list(tmp_path.iterdir()) == []
    log = tb_log.TrainingLog(tmp_path, graph, grad_norm=False)
    assert log.step(np.float32(0.5)) == {"train/loss": 0.5}
    log.close()
