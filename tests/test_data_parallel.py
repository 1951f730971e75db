"""Data-parallel training: the ``all_reduce`` op, the ``data_parallel`` pass and nn.Graph's
settings in one process, and, under ``mpiexec`` (``mpi_scripts/training.py``), the acceptance
tests of issue 15: 2 ranks x 32 rows equal 1 rank x 64 for 50 SGD-momentum and 50 Adam steps; a
float16 overflow in rank 1's batch alone makes both ranks skip and halve their scale, the weights
bitwise equal on both for 100 steps; a killed or raising rank ends the job; mismatched graphs are
an error on every rank, and so, at once, is a recompile on one rank alone (a load there only),
while a load on every rank continues the run bit for bit; ``mpiexec -n 2 miniflow train --ddp``
(with a batch above a rank's shard too).
The MPI tests skip only without the ``dist`` extra."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import miniflow as mf
from miniflow import distributed as dist
from miniflow.experiments.mlp import EvalGraph, TrainGraph, mlp
from miniflow.ir import Graph, evaluate
from miniflow.ops import get_op
from miniflow.passes.data_parallel import DataParallelState
from miniflow.passes.pipeline import CompileContext, CompileSettings, passes_for

from mpi_harness import (child_env, find_mpiexec, kill_a_rank, rank_results, requires_mpi,
                         run_cli, run_mpi)

X = np.random.default_rng(0).random((16, 64), dtype=np.float32)
Y = np.random.default_rng(1).integers(0, 10, 16)


def train_graph(opt="sgd", amp=False, scaler=None, sizes=(64, 128, 10)):
    mf.manual_seed(0)
    model = mlp(sizes)
    opt = {"sgd": lambda p: mf.optim.SGD(p, lr=0.1, momentum=0.9),
           "adam": lambda p: mf.optim.Adam(p, lr=0.01),
           "adadelta": lambda p: mf.optim.Adadelta(p)}[opt](model.parameters())
    graph = TrainGraph(model, opt)
    if amp:
        graph.config.enable_amp()
    if scaler is not None:
        graph.set_grad_scaler(scaler)
    return graph


def all_reduces(graph):
    return [n for n in graph.ir.nodes if n.op.name == "all_reduce"]


# ----------------------------------------------------------------------------- the op
@pytest.mark.parametrize("dtypes, attrs, error, match", [
    ([], {}, ValueError, r"all_reduce: needs at least one input \(a bucket of gradients\)"),
    (["float32", "float16"], {}, TypeError,
     r"all_reduce: a bucket holds one dtype; %a0 \(f32\[3\]\) and %a1 \(f16\[3\]\) differ"),
    (["int64"], {}, TypeError, r"all_reduce: reduce='mean' takes floating point .* got %a0 "
                               r"\(i64\[3\]\)"),
    (["float32"], {"reduce": "sum"}, TypeError, r"reduce='sum' takes int64 values, got %a0"),
    (["float32"], {"reduce": "max"}, ValueError,
     r"all_reduce: reduce='max'; choose one of 'mean', 'sum'"),
])
def test_all_reduce_rejects_bad_buckets(dtypes, attrs, error, match):
    g = Graph()
    ins = [g.add_input(f"a{i}", (3,), dt) for i, dt in enumerate(dtypes)]
    with pytest.raises(error, match=match):
        g.emit(get_op("all_reduce"), *ins, **attrs)


@pytest.mark.parametrize("opt", ["sgd", "adadelta"])
def test_all_reduce_is_the_identity_in_a_one_rank_world(opt):
    """evaluate (the reference) and the CPU plan of a data-parallel step in one process equal the
    step without data parallel, bit for bit in the plan."""
    plain, dp = train_graph(opt), train_graph(opt)
    dp.config.enable_data_parallel()
    state = {k: np.array(v) for k, v in dp.model.state_dict().items()}
    assert float(plain(X, Y)) == float(dp(X, Y))
    for (k, a), b in zip(plain.model.state_dict().items(), dp.model.state_dict().values()):
        assert a.tobytes() == b.tobytes(), k
    assert len(all_reduces(dp)) == 1 and not all_reduces(plain)
    ref = evaluate(dp.ir, [X, Y], variables={f"model.{k}": v for k, v in state.items()})
    ref_plain = evaluate(plain.ir, [X, Y],
                         variables={f"model.{k}": v for k, v in state.items()})
    for k in ref_plain:
        np.testing.assert_array_equal(ref[k], ref_plain[k], err_msg=k)


# ----------------------------------------------------------------------------- the pass
def test_pass_order_and_when_it_runs():
    names = [n for n, _ in passes_for(CompileContext())]
    assert "data_parallel" not in names
    from miniflow.passes.data_parallel import DataParallelConfig
    ctx = CompileContext(CompileSettings(data_parallel=DataParallelConfig()))
    names = [n for n, _ in passes_for(ctx)]
    assert names.index("autograd") < names.index("data_parallel") < names.index("loss_scale") \
        < names.index("optimizer")


def test_one_bucket_in_reverse_parameter_order_and_the_printed_ir():
    g = train_graph()
    g.config.enable_data_parallel()
    g(X, Y)
    assert g.compile_context.state[DataParallelState].buckets == [
        ["model.2.bias", "model.2.weight", "model.0.bias", "model.0.weight"]]
    (node,) = all_reduces(g)
    assert node.attrs == {"reduce": "mean"}
    for name, out in zip(g.compile_context.state[DataParallelState].buckets[0], node.outputs):
        assert g.ir.results[f"grad:{name}"] is out          # the updates read the means
    line = next(ln for ln in str(g.ir).splitlines() if "all_reduce(" in ln)
    assert line.strip() == ("%18: f32[10], %19: f32[10,128], %20: f32[128], %21: f32[128,64] = "
                            "all_reduce(%12, %14, %16, %17) {reduce='mean'}")


def test_with_gradient_accumulation_the_all_reduce_runs_once_per_call_on_the_mean_gradient():
    """gradient_accumulation runs before data_parallel: the ranks exchange the accumulated mean
    gradient once per call (PyTorch's ``no_sync`` pattern), not every micro-batch's."""
    g = train_graph()
    g.config.enable_data_parallel()
    g.config.set_gradient_accumulation_steps(4)
    g(X, Y)
    (node,) = all_reduces(g)
    schedule = g.ir.micro_batch_schedule()
    assert schedule.count == 4
    assert g.ir.nodes.index(node) in schedule.after
    for v in node.inputs:                       # the means of the accumulated gradients
        assert g.ir.nodes.index(v.producer) in schedule.after


def test_buckets_follow_the_cap():
    """64-128-10 gradients: 40, 5120, 512 and 32768 bytes in reverse order; a 6 KiB cap closes
    a bucket at 5160 and 38440 bytes: two buckets."""
    g = train_graph()
    g.config.enable_data_parallel(bucket_cap_mb=5000 / 2 ** 20)
    g(X, Y)
    assert g.compile_context.state[DataParallelState].buckets == [
        ["model.2.bias", "model.2.weight"], ["model.0.bias", "model.0.weight"]]
    assert [len(n.inputs) for n in all_reduces(g)] == [2, 2]


def test_amp_buckets_per_dtype_cast_around_a_float32_all_reduce_and_sum_the_counts():
    g = train_graph(amp=True, scaler=mf.amp.GradScaler())
    g.config.enable_fused_model_update_cast(False)      # the casts the unfused update reads
    g.config.enable_data_parallel()
    g(X, Y)
    means, counts = [n for n in all_reduces(g) if n.attrs["reduce"] == "mean"], \
        [n for n in all_reduces(g) if n.attrs["reduce"] == "sum"]
    # the last bias's gradient is float32 under AMP, the other three are float16
    assert g.compile_context.state[DataParallelState].buckets == [
        ["model.2.bias"], ["model.2.weight", "model.0.bias", "model.0.weight"]]
    half = means[1]
    assert all(v.dtype is mf.float32 for v in half.inputs + half.outputs)
    assert all(v.producer.op.name == "cast" and v.producer.inputs[0].dtype is mf.float16
               for v in half.inputs)
    users = g.ir.users()
    for out in half.outputs:      # cast back to float16, fused with the master-grad cast and the
        (reader,) = users[out]    # unscale (by 1/scale, the fused node's second input)
        assert reader.op.name == "fused_elementwise"
        assert reader.attrs["expr"] == "mul(f32(f16(x0)), x1)" and reader.inputs[0] is out
    (count,) = counts
    assert [v.producer.op.name for v in count.inputs] == ["multi_count_not_finite"] * 2
    assert g.ir.results["nonfinite_counts"] is count.outputs[0]
    schedule = next(n for n in g.ir.nodes if n.op.name == "dynamic_loss_scale_schedule")
    assert schedule.inputs[0] is count.outputs[1]        # every rank's scale moves alike
    assert all(n.inputs[3] is count.outputs[1] for n in g.ir.nodes if n.op.name == "sgd_update")


def test_float16_bucket_means_equal_the_collectives_own_float16_path(monkeypatch):
    """The casts around a float32 all-reduce give the bits of all_reduce_mean on float16 (sum
    and divide in float32, one rounding): here in a one-rank world, the identity either way."""
    g = train_graph(amp=True)
    g.config.enable_data_parallel()
    direct = train_graph(amp=True)
    direct.config.enable_data_parallel()
    from miniflow.passes import data_parallel as dp
    monkeypatch.setattr(dp, "summed_in_float32", lambda dtype: False)    # no casts
    direct(X, Y)
    monkeypatch.undo()
    g(X, Y)
    assert any(v.dtype is mf.float16 for n in all_reduces(direct) for v in n.inputs)
    for a, b in zip(g.model.state_dict().values(), direct.model.state_dict().values()):
        assert a.tobytes() == b.tobytes()


# ----------------------------------------------------------------------------- graph settings
def test_data_parallel_is_off_in_a_one_rank_world_and_for_graphs_that_do_not_train():
    g = train_graph()
    g(X, Y)
    assert dist.world_size() == 1 and not all_reduces(g)
    e = EvalGraph(g.model)
    e.config.enable_data_parallel()                     # nothing to average: no node
    e(X)
    assert not all_reduces(e)


def test_a_one_rank_world_makes_no_collective_call_even_with_data_parallel_on(monkeypatch):
    """The per-call agreement on recompiling (and the lr check) runs only for plans whose
    collectives run: none in a one-rank world, also after a load that recompiles."""
    def no_collective(*args):
        raise AssertionError("a collective in a one-rank world")
    for name in ("same_values", "all_gather_object", "check_same_values",
                 "check_same_across_ranks"):
        monkeypatch.setattr(dist, name, no_collective)
    g = train_graph()
    g.config.enable_data_parallel()
    g(X, Y)
    g.load_state_dict(g.state_dict())
    g(X, Y)
    g(X, Y)
    assert g.compile_count == 2 and all_reduces(g)


def test_the_message_of_a_recompile_on_some_ranks_names_them():
    from miniflow.compiler.driver import _recompiles_alone
    assert _recompiles_alone("G", [True, False, True]).startswith(
        "G recompiles at this call on ranks 0, 2 only (of 3 ranks): since the last call ")
    assert "on rank 1 only (of 2 ranks)" in _recompiles_alone("G", [False, True])


def test_enable_data_parallel_recompiles_and_checks_its_arguments():
    g = train_graph()
    g(X, Y)
    g.config.enable_data_parallel()
    g(X, Y)
    assert g.compile_count == 2 and all_reduces(g)
    g.config.enable_data_parallel(False)
    g(X, Y)
    assert g.compile_count == 3 and not all_reduces(g)
    with pytest.raises(TypeError, match=r"enable_data_parallel: enabled must be True or False, "
                                        r"got 'yes'"):
        g.config.enable_data_parallel("yes")
    for cap in (0, -1.0, float("inf"), "25", True):
        with pytest.raises(ValueError, match=rf"enable_data_parallel: bucket_cap_mb must be a "
                                             rf"finite number of MiB > 0, got {cap!r}"):
            g.config.enable_data_parallel(bucket_cap_mb=cap)


# ----------------------------------------------------------------------------- under mpiexec
def _npz(path):
    with np.load(path) as f:
        return dict(f)


@pytest.mark.slow
@requires_mpi
def test_two_ranks_of_32_equal_one_rank_of_64(tmp_path):
    """50 SGD-momentum and 50 Adam steps: the mean of the ranks' losses and the weights (and the
    optimizer state) of 2 ranks x 32 rows against 1 rank x 64 rows, to 1e-5; the ranks' weights
    bitwise equal, though rank 1 started from other weights (the broadcast at the first compile),
    also after rank 1 spoiled its Adam moments and a recompile gave it rank 0's."""
    runs = {}
    for n in (1, 2):
        (tmp_path / str(n)).mkdir()
        rc, output, _ = run_mpi("training.py", n, tmp_path / str(n), "equivalence")
        assert rc == 0, output
        runs[n] = (rank_results(tmp_path / str(n), n),
                   [_npz(tmp_path / str(n) / f"rank{r}.npz") for r in range(n)])
    (one,), (w_one,) = runs[1]
    two, w_two = runs[2]
    for opt in ("sgd", "adam"):
        mean = (np.array(two[0][f"{opt}_losses"]) + np.array(two[1][f"{opt}_losses"])) / 2
        assert len(mean) == 50
        np.testing.assert_allclose(mean, one[f"{opt}_losses"], rtol=1e-5, atol=1e-5, err_msg=opt)
        assert one[f"{opt}_buckets"] == []                  # one rank: no data parallel
        assert two[0][f"{opt}_buckets"] == [["model.2.bias", "model.2.weight", "model.0.bias",
                                             "model.0.weight"]]
    # the graph variables of sgd (4 params + 4 momentum buffers + the learning rate), adam (4
    # params + 12 moments/steps + the learning rate) and the resynced adam graph
    assert set(w_one) == set(w_two[0]) and len(w_one) == 9 + 17 + 17
    for key, value in w_one.items():
        assert w_two[0][key].tobytes() == w_two[1][key].tobytes(), key   # the replicas agree
        np.testing.assert_allclose(w_two[0][key], value, rtol=1e-5, atol=1e-5, err_msg=key)
    assert two[0]["compile_count"] == 2
    assert two[0]["local_all_reduce_nodes"] == 0


@requires_mpi
@pytest.mark.parametrize("seeds", ["apart", "alike"])
def test_each_rank_keeps_its_own_dropout_stream(tmp_path, seeds):
    """The compile's broadcast of rank 0's variables gave every rank rank 0's dropout stream too:
    ranks seeded apart (nanoGPT's ``manual_seed(1337 + rank)``) drew rank 0's masks. Now each
    keeps its own, as PyTorch's DDP never syncs a generator: seeded apart, the ranks' losses on
    one batch differ, seeded alike they are equal; the weights are the same on both either way
    (the averaged gradients)."""
    rc, output, _ = run_mpi("training.py", 2, tmp_path, "dropout", seeds)
    assert rc == 0, output
    r0, r1 = rank_results(tmp_path, 2)
    assert r0["weights"] == r1["weights"]
    assert [r0["stream"][0], r1["stream"][0]] == ([7, 8] if seeds == "apart" else [7, 7])
    assert (r0["losses"] != r1["losses"]) == (seeds == "apart"), (r0["losses"], r1["losses"])


@pytest.mark.slow
@requires_mpi
def test_overflow_on_one_rank_makes_every_rank_skip_and_back_off(tmp_path):
    """AMP, dynamic GradScaler, 100 steps; rank 1 alone overflows at the injected steps. Both
    ranks skip them, both scales halve, and every variable is bitwise equal on both ranks after
    every step (rank 1 started from another scale: the broadcast gave it rank 0's)."""
    rc, output, _ = run_mpi("training.py", 2, tmp_path, "overflow")
    assert rc == 0, output
    r0, r1 = rank_results(tmp_path, 2)
    steps = r0["steps"]
    assert len(steps) == 100 and steps == r1["steps"]      # found_inf, scale, skips, digests
    inject = set(r0["inject"])
    for i, s in enumerate(steps):
        prev_scale = steps[i - 1]["scale"] if i else 2.0 ** 16
        if i in inject:
            assert s["found_inf"] and s["scale"] == prev_scale / 2, i
            assert i == 0 or s["model"] == steps[i - 1]["model"], i       # skipped: unchanged
        else:
            assert not s["found_inf"] and s["model"] != steps[i - 1]["model"], i
    assert steps[-1]["skipped"] == len(inject)
    assert max(s["scale"] for s in steps) > 2.0 ** 16                     # it grew too
    assert "= all_reduce(" in r0["ir"] and "{reduce='sum'}" in r0["ir"]


@pytest.mark.slow
@requires_mpi
def test_killed_rank_ends_the_training_job(tmp_path):
    rc, output, seconds = kill_a_rank("training.py", tmp_path, "loop")
    assert rc != 0 and seconds < 30, (rc, seconds, output)


@pytest.mark.slow
@requires_mpi
def test_raising_rank_ends_the_training_job_with_its_error(tmp_path):
    rc, output, seconds = run_mpi("training.py", 2, tmp_path, "raise", timeout=120)
    assert rc != 0 and seconds < 60, (rc, seconds, output)
    assert "miniflow.distributed: rank 1 of 2: uncaught ValueError; aborting all 2 ranks" in output
    assert "[rank 1] ValueError: while running node" in output
    assert not (tmp_path / "rank0.json").exists()


@pytest.mark.slow
@requires_mpi
def test_mismatched_graphs_are_an_error_on_every_rank(tmp_path):
    rc, output, _ = run_mpi("training.py", 2, tmp_path, "mismatch")
    assert rc == 0, output
    e0, e1 = rank_results(tmp_path, 2)
    assert e0 == e1 and set(e0) == {"parameters", "batch", "lr", "lr later"}
    assert e0["parameters"].startswith(
        "the trained parameters of TrainGraph differ across the 2 ranks: rank 1 differs from "
        "rank 0 at item 1: rank 1 has 'model.0.weight f32[64,64]', rank 0 has "
        "'model.0.weight f32[128,64]'. Every rank must build the same graph")
    assert e0["batch"].startswith(
        "the compiled graphs of TrainGraph (the printed IR: inputs, variables, nodes) differ "
        "across the 2 ranks: rank 1 differs from rank 0 at item 2: rank 1 has "
        "'    %x: f32[31,64],  # input', rank 0 has '    %x: f32[32,64],  # input'")
    # an lr is no part of the compiled graph: checked before every step
    assert e0["lr"] == (
        "the learning rates of TrainGraph differ across the 2 ranks: rank 1 differs from rank 0 "
        "at item 1: rank 1 has 'optimizer 0 group 0 lr=0.2', rank 0 has 'optimizer 0 group 0 "
        "lr=0.1'. Every rank must set them alike: by the same scheduler, stepped on every rank, "
        "or by hand on every rank.")
    assert e0["lr later"].startswith(
        "the learning rates of TrainGraph differ across the 2 ranks: rank 1 differs from rank 0 "
        "at item 1: rank 1 has 'optimizer 0 group 0 lr=5.0', rank 0 has")


@pytest.mark.slow
@requires_mpi
@pytest.mark.parametrize("change", ["load_state_dict", "dropout.p", "eval"])
def test_a_recompile_on_one_rank_alone_is_an_error_on_every_rank_not_a_hang(tmp_path, change):
    """After 2 steps rank 1 alone makes its graph recompile; the ranks agree on recompiling in
    their call's first collective, so every rank raises at once (before: rank 1 compiled while
    rank 0 stepped, each waiting in another collective until the watchdog's abort, here 300 s)."""
    rc, output, seconds = run_mpi("training.py", 2, tmp_path, "alone", change, timeout=120,
                                  env={"MINIFLOW_DIST_TIMEOUT": "300"})
    assert rc != 0 and seconds < 60, (rc, seconds, output)
    assert "uncaught RankMismatchError; aborting all 2 ranks" in output
    assert ("RankMismatchError: TrainGraph recompiles at this call on rank 1 only (of 2 ranks)"
            in output), output
    assert "every rank must make the same change (load_state_dict on every rank" in output
    assert not (tmp_path / "rank0.json").exists()


@pytest.mark.slow
@requires_mpi
def test_a_compiled_plan_of_another_mode_on_one_rank_is_an_error_on_every_rank(tmp_path):
    """Every rank compiled a train and an eval plan; then rank 1 alone calls ``eval()``: no rank
    recompiles, but the ranks would run different plans (before: the watchdog's abort, or
    different steps silently). The call's first collective compares the plans' keys."""
    rc, output, seconds = run_mpi("training.py", 2, tmp_path, "alone", "eval again",
                                  timeout=120, env={"MINIFLOW_DIST_TIMEOUT": "300"})
    assert rc != 0 and seconds < 60, (rc, seconds, output)
    assert ("RankMismatchError: TrainGraph is called with other inputs or module modes on some "
            "ranks: rank 0: inputs (32, 64) <f4, (32,) <i8; modes train; rank 1: inputs "
            "(32, 64) <f4, (32,) <i8; modes eval.") in output, output
    assert not (tmp_path / "rank0.json").exists()


@pytest.mark.slow
@requires_mpi
def test_a_load_on_every_rank_after_the_first_call_continues_the_run_bit_for_bit(tmp_path):
    """Every rank loads the state dict of step 3 into a graph that stepped elsewhere: every rank
    recompiles together, and steps 4 to 6 give the uninterrupted run's losses and variables."""
    rc, output, _ = run_mpi("training.py", 2, tmp_path, "reload")
    assert rc == 0, output
    for r in rank_results(tmp_path, 2):
        assert r["again"] == r["whole"] and r["same"] and r["compile_count"] == 2, r


@pytest.mark.slow
@requires_mpi
def test_miniflow_train_ddp(tmp_path):
    """``mpiexec -n 2 miniflow train --ddp``: trains, rank 0 alone prints and writes --save."""
    save = tmp_path / "model.safetensors"
    res = run_cli(2, tmp_path, "train", "--ddp", "--epochs", "3", "--save", save, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.count("test accuracy:") == 1 and out.count("saved the model") == 1, out
    assert "data parallel: world size 2, batch 64 per rank (128 per step), 1 thread(s) per rank" \
        in out
    acc = float(out.split("test accuracy: ")[1].split("%")[0])
    assert acc > 80, out
    assert "36 steps" in out                                 # 3 epochs of 719 rows / 64 per rank
    state = mf.load(str(save))
    assert sorted(state) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


@pytest.mark.slow
@requires_mpi
def test_miniflow_train_ddp_batch_above_a_ranks_shard_prints_the_batch_it_used(tmp_path):
    """``--batch-size 1000`` on 2 ranks, each with a shard of 719 rows: every step takes the
    whole shard (PyTorch's DataLoader over a DistributedSampler gives min(batch, shard)), as
    the single-process ``--batch-size 5000`` takes the 1437 rows; it printed ``batch 1000 per
    rank (2000 per step)``."""
    res = run_cli(2, tmp_path, "train", "--ddp", "--batch-size", "1000", "--epochs", "2",
                  "--hidden", "8", "--no-progress", timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "weight decay 0, batch 719 (--batch-size 1000 is more than the 719 rows of a rank's " \
           "shard)), float32" in out, out
    assert "data parallel: world size 2, batch 719 per rank (1438 per step)" in out, out
    assert "for 2 steps" in out, out


@pytest.mark.slow
@requires_mpi
def test_miniflow_train_lenet_ddp(tmp_path):
    """``mpiexec -n 2 miniflow train --model lenet --ddp``: the conv-bn LeNet trains data
    parallel (its gradients all-reduced; each rank's batch-norm statistics its own, evaluated on
    rank 0), one rank reports, the saved parameters are rank 0's (equal on both ranks)."""
    save = tmp_path / "lenet.safetensors"
    res = run_cli(2, tmp_path, "train", "--model", "lenet", "--ddp", "--epochs", "6",
                  "--batch-size", "32", "--save", save, "--no-progress")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.count("test accuracy:") == 1 and "model: lenet" in out, out
    assert "data parallel: world size 2, batch 32 per rank (64 per step)" in out, out
    assert "138 steps" in out                                # 6 epochs of 719 rows / 32 per rank
    assert float(out.split("test accuracy: ")[1].split("%")[0]) > 95, out
    state = mf.load(str(save))
    assert "bn1.running_mean" in state and int(state["bn1.num_batches_tracked"]) == 138, \
        sorted(state)


@pytest.mark.slow
@requires_mpi
def test_ddp_benchmark_runs_and_prints_the_seeds_lines(tmp_path):
    """``benchmarks/ddp.py`` (miniflow's lines; PyTorch's too where it is installed)."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "ddp.py"
    cmd = [find_mpiexec(), "-n", "2", sys.executable, str(script), "--repeats", "1", "--models",
           "mlp", "--batches", "8", "--dtypes", "fp32", "--json", str(tmp_path / "ddp.json")]
    res = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=180,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"^miniflow mlp time: \d+\.\d{3}ms \(= \d+\.\dms / \d+, "
                     r"input_shape=\[8, 64\], ddp, world size=2\)$", res.stdout, re.M), res.stdout
    (result,) = json.loads((tmp_path / "ddp.json").read_text())["results"]
    assert result["model"] == "mlp" and result["step_s"]["miniflow"] > 0
