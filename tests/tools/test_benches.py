"""bench/bench_ops.py, bench/bench_decode.py and bench/bench_attention.py --side_by_side run (no
timing is checked: speed is measured in benchmarks, never in tests). Without PyTorch they say so
in one line; with it, a tiny run prints its JSON lines."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None
RUNS = {"bench_ops.py": ["--ops", "add", "softmax", "--rounds", "1", "--calls", "5"],
        "bench_decode.py": ["--configs", "tiny", "--batches", "2", "--rounds", "1"]}


def run(script, *args, env=None):
    return subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.mark.skipif(HAS_TORCH, reason="PyTorch is installed here")
@pytest.mark.parametrize("script", sorted(RUNS))
def test_without_pytorch_a_benchmark_says_so_in_one_line(script):
    done = run(script, *RUNS[script])
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [f"{script[:-3]}: needs PyTorch in this Python (pip install "
                                                "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu)"]


@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
@pytest.mark.parametrize("script", sorted(RUNS))
def test_a_tiny_benchmark_run_prints_the_cpu_then_one_line_per_case(script):
    done = run(script, *RUNS[script])
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert "cpu" in lines[0]
    if script == "bench_decode.py":                              # one config, one batch size
        assert len(lines) == 2 and lines[1]["tokens_agree"] == 1.0 and lines[1]["speed_vs_torch"] > 0
    else:
        assert [r["op"] for r in lines[1:]] == ["add", "softmax"]


SIDE_BY_SIDE = ["--side_by_side", "--sizes", "64", "--impls", "tiled", "torch", "--heads", "2", "--head_dim", "8",
                "--repeats", "1", "--settle", "0"]


@pytest.mark.skipif(HAS_TORCH, reason="PyTorch is installed here")
def test_side_by_side_attention_without_pytorch_says_so_in_one_line():
    done = run("bench_attention.py", *SIDE_BY_SIDE)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"bench_attention: --side_by_side needs PyTorch in {sys.executable} "
                                                "(pip install torch==2.13.0 --index-url "
                                                "https://download.pytorch.org/whl/cpu)"]


def test_side_by_side_attention_needs_a_tinyattn_side():
    done = run("bench_attention.py", "--side_by_side", "--impls", "torch")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == ["bench_attention: --side_by_side needs torch and at least one "
                                                "tinyattn implementation in --impls"]


@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
def test_side_by_side_attention_prints_a_ratio_per_implementation():
    done = run("bench_attention.py", *SIDE_BY_SIDE)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0]["kind"] == "config"
    (record,) = lines[1:]
    assert record["kind"] == "side_by_side" and record["impl"] == "tiled" and record["n"] == 64
    assert len(record["ms_runs"]) == len(record["torch_ms_runs"]) == 1 and record["time_over_torch"] > 0
    assert max(record["rel_err_vs_torch"].values()) < 1e-5                # both sides computed the same


def test_bench_ab_compares_two_checkouts_in_fresh_processes():
    """One pair of a tiny training step, the checkout against itself: one JSON line for it, then the CPU."""
    done = run("bench_ab.py", str(ROOT), str(ROOT), "--pairs", "2", "--workloads", "step:tiny")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line.get("workload") for line in lines[:-1]] == ["step:tiny"] and "cpu" in lines[-1]
    assert lines[0]["pairs"] == 2 and len(lines[0]["ms_pairs"]) == 2 and lines[0]["after_over_before_median"] > 0


def test_bench_ab_times_each_small_op_with_each_checkouts_library():
    """ops:tiny, the checkout against itself, numba's kernels off on one side: a line per op, in us."""
    done = run("bench_ab.py", str(ROOT), str(ROOT), "--pairs", "2", "--workloads", "ops:tiny",
               "--after_env", "TINYATTN_CPU_KERNELS=0")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line.get("workload") for line in lines[:-1]] == [f"ops:tiny {op}" for op in
                                                           ("add", "matmul", "softmax", "layer_norm", "linear")]
    assert all(line["pairs"] == 2 and len(line["us_pairs"]) == 2 and line["after_us_median"] > 0 for line in lines[:-1])
    assert "cpu" in lines[-1]


def test_bench_denormal_prints_a_ratio_per_case_and_flushing_mode():
    """A tiny run: the CPU, then the matmul and the step (fast layer on), each with flushing off, then on."""
    from tinyattn.fast import denormals
    if denormals._fenv_layout() is None:
        pytest.skip("flushing subnormals is supported on x86-64 Linux and macOS")
    this_checkout = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = run("bench_denormal.py", "--config", "tiny", "--steps", "1", "--repeats", "1", "--size", "64", "--fast", "on",
               env=this_checkout)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert "cpu" in lines[0]
    assert [(r["case"], r["flush"]) for r in lines[1:]] == [("matmul", False), ("matmul", True),
                                                           ("step", False), ("step", True)]
    assert all(r["normal_ms"] > 0 and r["subnormal_over_normal"] > 0 for r in lines[1:])


def test_bench_finetune_steps_times_each_side_flushed_and_not(tmp_path):
    """A run fine-tuned for two steps on a few conversations; one timed step a side and mode."""
    from data.prepare import main as prepare
    from train.command import main as train
    from tinyattn.fast import denormals
    if denormals._fenv_layout() is None:
        pytest.skip("flushing subnormals is supported on x86-64 Linux and macOS")
    rows = [{"messages": [{"role": "user", "content": f"spell {w}"}, {"role": "assistant", "content": " ".join(w)}]}
            for w in ("cat", "dog", "bird", "fish", "cow", "hen", "owl", "ant", "bee", "elk")]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert prepare([str(tmp_path / "c.jsonl"), "--out_dir", str(tmp_path / "conv")]) == 0
    assert train(["--data", str(tmp_path / "conv"), "--out_dir", str(tmp_path / "run"), "--n_layer", "1",
                  "--n_head", "2", "--n_embd", "16", "--block_size", "32", "--batch_size", "4", "--max_iters", "2",
                  "--eval_iters", "1", "--quiet", "--sample_tokens", "0"]) == 0
    sides = ["tinyattn", "torch"] if HAS_TORCH and importlib.util.find_spec("transformers") else ["tinyattn"]
    this_checkout = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = run("bench_finetune_steps.py", "--run", str(tmp_path / "run"), "--data", str(tmp_path / "conv"),
               "--steps", "1", "--batch_size", "4", "--sides", *sides, env=this_checkout)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert "cpu" in lines[0]
    timed = [(r["side"], r["flush"]) for r in lines if "flush" in r]
    assert timed == [(side, flush) for side in sides for flush in (False, True)]
    assert all(r["not_flushed_over_flushed"] > 0 for r in lines if "not_flushed_over_flushed" in r)


@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_bench_step_builds_the_same_model_on_both_sides(block):
    """--block modern: rotary, RMSNorm, SwiGLU, QK-norm, GQA, no bias, untied, in tinyattn and in torch."""
    done = run("bench_step.py", "--device", "cpu", "--config", "tiny", "--block", block, "--warmup", "0",
               "--blocks", "1", "--steps", "1", "--no_unfused")
    assert done.returncode == 0, done.stderr
    check = json.loads(done.stdout)["same_architecture_check"]
    assert check["parameters_tinyattn"] == check["parameters_torch"] and check["rel_diff"] < 1e-6


@pytest.mark.parametrize("schedule", ["rows", "whole", "pool"])
def test_bench_breakdown_accounts_for_the_whole_step_by_category(schedule):
    """A baby step on each side (PyTorch's where installed): every category of the calling thread's
    time adds up to the profiled step; the blocks ran fused, in the schedule the environment asks for."""
    sides = ["tinyattn", "torch"] if HAS_TORCH else ["tinyattn"]
    done = run("bench_breakdown.py", "--config", "baby", "--steps", "2", "--warmup", "1", "--threads", "2",
               "--sides", *sides, env={**os.environ, "TINYATTN_BLOCK_SCHEDULE": schedule})
    assert done.returncode == 0, done.stderr
    *table, line = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert table[0].split()[-len(sides):] == sides and "cpu" in report
    for name in sides:
        side = report["sides"][name]
        times = [t for t in side["categories"].values() if t is not None]
        assert abs(sum(times) - side["ms_per_step_profiled"]) < 1e-6 * side["ms_per_step_profiled"]
        assert side["categories"]["products"] > 0 and side["categories"]["optimizer"] > 0 and side["ms_per_step"] > 0
    tiny = report["sides"]["tinyattn"]
    assert tiny["blocks_fused"] and tiny["block_schedule"] == schedule and tiny["pool_threads"] == 1
    pool = tiny["pool_ms_per_thread"]
    assert pool["idle"] > 0 and pool["elementwise"] > 0
    assert (pool["products"] > 0) == (schedule != "whole")         # whole: BLAS's threads, on the caller's
