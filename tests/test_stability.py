"""``miniflow stability --quick``, the CI run of the training-stability study (issue 6): it writes
its figures, summary.md and metrics.json, and metrics.json shows the qualitative results:

* static 2^17: "legacy" and "cast_back" skip every step; "fp32" and fp32 training reach >= 90%;
* dynamic scaler from 2^16: the largest scale applied on a step is <= 2^15 under "legacy" (and
  "cast_back") and >= 2^17 under "fp32";
* the gray-path model skips (and does not learn) without black_identity and trains with it;
* the controls: white_identity adds float16 nodes at no accuracy cost, small gradients underflow
  without loss scaling, and no skipping makes the weights NaN.
"""
import json

import numpy as np
import pytest

from miniflow.cli import main
from miniflow.experiments.stability_plots import FIGURES


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("stability")
    assert main(["stability", "--quick", "--out", str(out)]) == 0
    return out, json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def metrics(study):
    return study[1]


def _runs(metrics, experiment, **match) -> list:
    runs = [r for r in metrics["runs"] if r["experiment"] == experiment
            and all(r[k] == v for k, v in match.items())]
    assert runs, (experiment, match)
    return runs


def _one(metrics, experiment, **match) -> dict:
    (run,) = _runs(metrics, experiment, **match)
    return run


def test_quick_writes_figures_summary_and_metrics(study):
    out, metrics = study
    for name in FIGURES:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    summary = (out / "summary.md").read_text()
    for heading in ("## Headline", "## Static scale sweep", "## Dynamic scaler",
                    "## Gray-path control", "## Why loss scaling", "## Skipping matters"):
        assert heading in summary
    assert metrics["config"]["seeds"] == 1 and metrics["config"]["steps"] == 220
    assert len({r["seed"] for r in metrics["runs"]}) == 1


def test_per_run_results_agree_with_the_per_step_series(metrics):
    for r in metrics["runs"]:
        s = r["per_step"]
        assert len(s["loss"]) == len(s["scale"]) == len(s["skipped"]) == 220
        assert r["skipped_fraction"] == pytest.approx(np.mean(s["skipped"]))
        applied = [sc for sc, k in zip(s["scale"], s["skipped"]) if not k]
        assert r["max_applied_scale"] == (max(applied) if applied else None)
        assert r["final_test_accuracy"] == pytest.approx(r["evaluations"]["test_accuracy"][-1],
                                                         abs=1e-4)


def test_float16_gradients_are_found_under_amp_only(metrics):
    """The study reads the float16 gradients behind the loss-scale stage (GradientReader): under AMP
    the matmul gradients are float16, without AMP there are none."""
    amp = _one(metrics, "static_sweep", policy="fp32", scale=2.0 ** 12)["per_step"]
    fp32 = _one(metrics, "static_sweep", policy="none", scale=2.0 ** 12)["per_step"]
    assert all(0 < z < 1 for z in amp["fp16_zero_fraction"])
    assert all(z is None for z in fp32["fp16_zero_fraction"])
    assert all(n is not None and n > 0 for n in amp["grad_norm"] + fp32["grad_norm"])


@pytest.mark.parametrize("policy", ["legacy", "cast_back"])
def test_legacy_and_cast_back_skip_every_step_at_static_2_17(metrics, policy):
    run = _one(metrics, "static_sweep", policy=policy, scale=2.0 ** 17)
    assert run["skipped_fraction"] == 1.0
    assert run["max_applied_scale"] is None


@pytest.mark.parametrize("policy", ["fp32", "none"])
def test_fp32_policy_at_2_17_and_fp32_training_reach_90_percent(metrics, policy):
    run = _one(metrics, "static_sweep", policy=policy, scale=2.0 ** 17)
    assert run["final_test_accuracy"] >= 0.90
    assert run["skipped_fraction"] == 0.0


@pytest.mark.parametrize("policy", ["legacy", "cast_back"])
def test_dynamic_scaler_never_applies_a_step_above_2_15_before_the_fix(metrics, policy):
    run = _one(metrics, "dynamic", policy=policy)
    assert run["max_applied_scale"] <= 2.0 ** 15
    assert 0 < run["skipped_fraction"] < 0.1      # one skipped step per growth attempt
    assert run["final_test_accuracy"] >= 0.90


def test_dynamic_scaler_grows_past_2_17_with_the_fp32_policy(metrics):
    assert _one(metrics, "dynamic", policy="fp32")["max_applied_scale"] >= 2.0 ** 17


def test_gray_path_skips_without_black_identity_and_trains_with_it(metrics):
    plain = _one(metrics, "gray_path", label="AMP")
    pinned = _one(metrics, "gray_path", label="AMP + black_identity")
    assert plain["skipped_fraction"] >= 0.5 and plain["final_test_accuracy"] < 0.5
    assert pinned["skipped_fraction"] == 0.0 and pinned["final_test_accuracy"] >= 0.90
    assert pinned["amp_nodes"]["fp16"] < plain["amp_nodes"]["fp16"]


def test_white_identity_adds_fp16_nodes_without_accuracy_loss(metrics):
    plain = _one(metrics, "white_identity", label="AMP")
    white = _one(metrics, "white_identity", label="AMP + white_identity")
    assert white["amp_nodes"]["fp16"] > plain["amp_nodes"]["fp16"]
    assert white["final_test_accuracy"] >= plain["final_test_accuracy"] - 0.01


def test_small_gradients_underflow_without_loss_scaling(metrics):
    small = {r["scale"]: r for r in _runs(metrics, "underflow") if r["loss_log2_weight"] < 0}
    assert small[1.0]["mean_underflow"] > 0.9 and small[1.0]["final_test_accuracy"] < 0.5
    assert small[2.0 ** 12]["mean_underflow"] < 0.1
    assert small[2.0 ** 12]["final_test_accuracy"] >= 0.90
    plain = _one(metrics, "underflow", loss_log2_weight=0, scale=1.0)
    assert plain["mean_underflow"] < small[1.0]["mean_underflow"]


def test_without_skipping_the_weights_turn_to_nan(metrics):
    for r in _runs(metrics, "skipping"):
        if r["skip_nonfinite"]:
            assert r["final_nonfinite_params"] == 0.0
        else:
            assert r["final_nonfinite_params"] > 0.5 and r["skipped_fraction"] == 0.0
