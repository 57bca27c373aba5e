"""The lesson's experiments (train/experiments/) run at a tiny size and return their keys.

They are experiments, not tests: only the claims that hold for any model
and any machine are asserted (the causal mask, the scaling at d_k = 64);
timings are never compared.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from train import checkpoint
from train.data import tokenizer_to_json
from train.experiments import _common, causal, heads, quadratic, scaling, seeds, sinks


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """A checkpoint folder holding a GPT trained a few steps on the "it" corpus."""
    out_dir = tmp_path_factory.mktemp("ckpt")
    model, tok, _, _ = _common.tiny_model(steps=5)
    optimizer = model.configure_optimizer(0.0, 1e-3, (0.9, 0.99))
    meta = dict(config=model.config.to_dict(), tokenizer=tokenizer_to_json(tok), dataset="coref", args={})
    checkpoint.save(str(out_dir / "ckpt.npz"), model, optimizer, meta)
    return str(out_dir)


# ---------------------------------------------------------------- scaling
def test_scaling_saturates_without_the_scale(tmp_path):
    r = scaling.run(d_k=64, n_queries=200, n_keys=32, sweep=(4, 64), out_dir=str(tmp_path), plot_png=False)
    for key in ("scaled", "unscaled", "grad_scores_ratio", "grad_scores_median_ratio", "grad_q_ratio", "sweep"):
        assert key in r
    s, u = r["scaled"], r["unscaled"]
    assert u["max_weight"] > s["max_weight"] + 0.3
    assert u["entropy"] < s["entropy"] - 1.0
    assert s["entropy"] <= r["max_entropy"]
    assert u["saturated"] > s["saturated"]
    assert r["grad_scores_median_ratio"] > 1.0                # the unscaled softmax passes less gradient
    assert 0.8 < s["score_std"] < 1.2 and 6 < u["score_std"] < 10    # 1 and sqrt(64)
    assert [row["d_k"] for row in r["sweep"]] == [4, 64]


def test_scaling_cli_prints_a_json_line(tmp_path, capsys):
    assert scaling.main(["--tiny", "--out_dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "d_k = 64" in lines[-2]
    assert json.loads(lines[-1])["d_k"] == 64
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "scaling-tiny.png").exists()


# ---------------------------------------------------------------- causal
def test_causal_past_logits_are_bit_identical():
    r = causal.run(tiny=True, t=5)
    assert r["past_identical"] and r["equal_positions"] == 6
    assert r["future_changed"] and r["changed_positions"] == r["n_positions"] - 6
    assert r["max_abs_diff_past"] == 0.0 and r["max_abs_diff_future"] > 0.0
    diff = r["max_abs_diff_per_position"]
    assert diff[:6] == [0.0] * 6 and min(diff[6:]) > 0.0 and r.get("plot") is None    # run() draws only when asked


def test_causal_cli_draws_the_mask_and_the_changes(tmp_path, capsys):
    assert causal.main(["--tiny", "--t", "5", "--out_dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["past_identical"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "causal-tiny.png").exists() and not (tmp_path / "causal.png").exists()


def test_causal_on_a_checkpoint(tiny_ckpt, capsys):
    assert causal.main(["--out_dir", tiny_ckpt]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["past_identical"] and r["future_changed"]
    assert r["text"].startswith("the animal didn't cross")


def test_causal_without_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert causal.main(["--out_dir", str(tmp_path)]) == 1
    assert "no checkpoint" in capsys.readouterr().err


# ---------------------------------------------------------------- heads
def test_js_divergence_bounds():
    p = np.array([[0.5, 0.5, 0.0, 0.0]])
    q = np.array([[0.0, 0.0, 0.3, 0.7]])
    assert heads.js_bits(p, p)[0] == pytest.approx(0.0)
    assert heads.js_bits(p, q)[0] == pytest.approx(1.0)


def test_identical_heads_differ_by_zero():
    T = 6
    w = np.broadcast_to(_common.uniform_causal(T), (3, 4, T, T)).copy()     # (B, H, T, T), all heads alike
    valid = heads.valid_queries(np.array([T, T, 4]), T)
    layers, baseline = heads.analyse([w], valid, np.zeros((3, T), dtype=bool))
    assert layers[0]["mean_pairwise_js"] == pytest.approx(0.0)
    assert layers[0]["heads"][0]["prev"] == pytest.approx(baseline["prev"])


def test_heads_tiny(tmp_path):
    r = heads.run(out_dir=str(tmp_path), tiny=True, n_sentences=12, steps=10, plot_png=False)
    assert r["inputs"] == "held-out 'it' sentences" and r["n_sequences"] == 12
    assert len(r["layers"]) == _common.TINY_CONFIG["n_layer"]
    for layer in r["layers"]:
        assert 0.0 <= layer["mean_pairwise_js"] <= 1.0
        assert len(layer["heads"]) == _common.TINY_CONFIG["n_head"]
        for h in layer["heads"]:
            assert set(heads.FEATURES) <= set(h) and 0.0 <= h["prev"] <= 1.0 and h["top_offset"] >= 0


def test_heads_on_a_checkpoint_with_plot(tiny_ckpt):
    r = heads.run(out_dir=tiny_ckpt, n_sentences=8)
    assert len(r["layers"]) == 2
    if r["plot"] is not None:
        assert Path(r["plot"]).exists()


# ---------------------------------------------------------------- quadratic
def test_quadratic_runs_and_fits():
    r = quadratic.run(sizes=(16, 32, 64), d=8, repeats=1, warmup=0, plot_png=False)
    assert {"naive", "scores"} <= set(r["methods"])
    if getattr(quadratic.F, "flash_attention", None) is not None:
        assert "flash" in r["methods"]
    for m in r["methods"].values():
        assert m["error"] is None, m["error"]
        assert len(m["time_s"]) == 3 and all(t > 0 for t in m["time_s"])
        assert m["time_exponent"] is not None and m["memory_exponent"] is not None
    naive = r["methods"]["naive"]["peak_bytes"]
    assert naive[0] < naive[1] < naive[2]


def test_fit_exponent():
    n = [64, 128, 256, 512]
    assert quadratic.fit_exponent(n, [x ** 2 for x in n]) == pytest.approx(2.0)
    assert quadratic.fit_exponent(n, [5.0 * x for x in n]) == pytest.approx(1.0)


# ---------------------------------------------------------------- sinks
def test_sinks_even_heads_score_one():
    T = 8
    ids = np.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    w = np.broadcast_to(_common.uniform_causal(T), (1, 2, T, T))
    r = sinks.analyse([w], ids, {"x": 1})
    for h in r["heads"]:
        assert h["first_ratio"] == pytest.approx(1.0) and h["delimiters_ratio"] == pytest.approx(1.0)
    assert r["baseline_first"] == pytest.approx(np.mean([1 / (i + 1) for i in range(1, T)]))


def test_sinks_tiny(tmp_path):
    r = sinks.run(out_dir=str(tmp_path), tiny=True, n_windows=8, steps=10, plot_png=False)
    for key in ("heads", "baseline_first", "baseline_delimiters", "first_ratio", "delimiters_ratio",
                "by_token", "strongest_first"):
        assert key in r
    assert r["delimiters"] == [".", ",", "=", "<eos>"]
    assert len(r["heads"]) == _common.TINY_CONFIG["n_layer"] * _common.TINY_CONFIG["n_head"]
    assert 0.0 < r["baseline_first"] < 1.0 and 0.0 < r["baseline_delimiters"] < 1.0


# ---------------------------------------------------------------- seeds
def test_seeds_summary_is_min_and_median():
    rows = [dict(heldout_accuracy=a, heldout_exact=e, heldout_attention_correct=t)
            for a, e, t in ((1.0, 0.9, 0.5), (0.8, 1.0, 0.95), (0.9, 0.97, 0.91))]
    s = seeds.summarise(rows)
    assert s["accuracy"] == dict(min=0.8, median=0.9, at_least_0_9=2, at_least_0_95=1)
    assert s["exact"]["min"] == 0.9 and s["exact"]["median"] == 0.97 and s["exact"]["at_least_0_95"] == 2
    assert s["attention"]["at_least_0_9"] == 2 and s["attention"]["at_least_0_95"] == 1


def test_seeds_tiny_trains_each_seed_in_its_own_process(tmp_path, capsys):
    """Two seeds of a tiny model, two processes: one JSON line per seed, then the summary."""
    assert seeds.main(["--tiny", "--seeds", "2", "--first", "3", "--jobs", "2", "--out_dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    per_seed = [json.loads(line) for line in lines[:2]]
    assert [r["seed"] for r in per_seed] == [3, 4]
    r = json.loads(lines[-1])
    assert [row["seed"] for row in r["seeds"]] == [3, 4] and r["jobs"] == 2
    for row in r["seeds"]:
        summary = json.loads((tmp_path / f"seed{row['seed']}" / "summary.json").read_text())
        assert row["heldout_exact"] == summary["heldout_exact"] and summary["iters"] == 30
        assert row["referent_head"] == summary["referent_head"]
        assert set(row["choice_by_query"]) == {"adjective", ".", "it", "="}
    for name in ("accuracy", "exact", "attention"):
        values = [row[f"heldout_{'attention_correct' if name == 'attention' else name}"] for row in r["seeds"]]
        assert r["summary"][name]["min"] == min(values)
    assert "Over 2 seeds" in lines[-2]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "seeds.png").exists()


def test_seeds_refuses_flags_it_sets_itself(capsys):
    assert seeds.main(["--tiny", "--seeds", "1", "--", "--seed", "3"]) == 1
    assert "--seed is not a flag of this experiment" in capsys.readouterr().err
    assert seeds.main(["--seeds", "1", "--n_embd", "30", "--n_head", "4"]) == 2       # train's own check, one line
    assert "must be divisible" in capsys.readouterr().err
