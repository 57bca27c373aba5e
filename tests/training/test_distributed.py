"""tinyattn.distributed and data-parallel training (mpiexec -n 2 python -m train).

The tests that start processes need mpi4py and an mpiexec (pip install -e ".[test,dist]");
without them they skip and say so. The rest run in this one process, a world of one.
"""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.distributed as dist
from train import checkpoint, parallel

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAMS = os.path.join(REPO, "tests", "support", "dist_programs.py")
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
        "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n") * 40
TINY = ["--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--block_size", "16", "--eval_iters", "2",
        "--warmup_iters", "2", "--lr_decay_iters", "20", "--learning_rate", "3e-3", "--quiet", "--sample_tokens", "0"]
TIMEOUT = 120            # seconds: a job that hangs fails the test instead of the suite


def find_mpiexec():
    """The mpiexec beside this Python (the mpich wheel puts it there) or on PATH, if mpi4py is installed."""
    if importlib.util.find_spec("mpi4py") is None:
        return None, 'mpi4py is not installed (pip install -e ".[test,dist]")'
    found = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    return found, None if found else 'no mpiexec on PATH or beside python (pip install -e ".[test,dist]")'


MPIEXEC, WHY_NOT = find_mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason=f"needs MPI: {WHY_NOT}")


def mpiexec(n, *args):
    """``mpiexec -n N python ARGS`` from the repository root -> the finished process (output as text)."""
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], capture_output=True,
                          text=True, timeout=TIMEOUT)


def train_cmd(n, text_file, out_dir, *extra):
    """python -m train on N processes (plain python for one), which must succeed. -> its process."""
    args = ["-m", "train", "--data", text_file, "--out_dir", str(out_dir), *TINY, *extra]
    done = mpiexec(n, *args) if n > 1 else subprocess.run([sys.executable, *args], capture_output=True,
                                                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def step_losses(out_dir):
    """Every step's training loss, as the checkpoint keeps them (the global batch's mean)."""
    return np.array(checkpoint.read_meta(os.path.join(out_dir, "ckpt.npz"))["train_losses"])


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


# ---------------------------------------------------------------------------
# a world of one: what runs without mpiexec
# ---------------------------------------------------------------------------
def test_without_a_launcher_the_world_is_this_process():
    assert dist.launched() == (1, 0)
    assert (dist.init(), dist.rank(), dist.world_size()) == (1, 0, 1)
    t = ta.tensor([1.0, 2.0, 3.0])
    before = t.data
    assert dist.all_reduce(t, "mean") is t and t.data is before                 # untouched, not even copied
    assert dist.broadcast(t) is t and t.data is before
    assert dist.broadcast_object({"a": 1}) == {"a": 1} and dist.all_gather_object(5) == [5]
    dist.barrier()


def test_a_launcher_is_read_from_its_environment(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    assert dist.launched() == (4, 3)
    monkeypatch.setenv("PMI_SIZE", "2")                                           # MPICH's comes first
    monkeypatch.setenv("PMI_RANK", "1")
    assert dist.launched() == (2, 1)


def test_collectives_refuse_what_they_cannot_do():
    with pytest.raises(ValueError, match="op must be one of sum, mean, max, min, got 'avg'"):
        dist.all_reduce(ta.tensor([1.0]), "avg")
    with pytest.raises(TypeError, match="op='mean' needs a float tensor, got int64"):
        dist.all_reduce(ta.tensor([1, 2]), "mean")
    with pytest.raises(TypeError, match="expected a Tensor, got ndarray"):
        dist.all_reduce(np.ones(3))
    with pytest.raises(ValueError, match="root must be a rank from 0 to 0, got 1"):
        dist.broadcast(ta.tensor([1.0]), root=1)


def test_buckets_close_before_the_parameter_that_would_overflow_them():
    # float32 sizes 10, 10, 30, 5, 100 elements; buckets of 100 bytes = 25 elements
    assert dist.buckets_of([10, 10, 30, 5, 100], 4, 100) == [[0, 1], [2], [3], [4]]
    assert dist.buckets_of([10, 10, 5], 4, 100) == [[0, 1, 2]]                    # exactly full: one bucket
    assert dist.buckets_of([], 4, 100) == []


def test_grad_averager_buckets_by_dtype_and_does_nothing_alone():
    params = [ta.zeros(10, requires_grad=True), ta.zeros(10, requires_grad=True),
              ta.zeros(3, dtype="float64", requires_grad=True), ta.zeros(2, requires_grad=True)]
    averager = dist.GradAverager(params, bucket_mb=1)
    position = {id(p): i for i, p in enumerate(params)}
    assert [[position[id(p)] for p in b] for b in averager.buckets] == [[0, 1], [2], [3]]
    assert averager.bytes_per_step == 4 * 10 + 4 * 10 + 8 * 3 + 4 * 2
    params[0].grad = ta.ones(10)
    assert averager.average() == 0 and params[0].grad.numpy().tolist() == [1.0] * 10 and params[1].grad is None
    with pytest.raises(ValueError, match="empty list"):
        dist.GradAverager([])


def test_each_rank_has_its_own_batch_stream_and_rank_0_keeps_the_seeds():
    draw = lambda rng: rng.integers(0, 1 << 30, size=8).tolist()                  # noqa: E731
    assert draw(parallel.data_rng(7, 0)) == draw(np.random.default_rng(7))       # one process: as before
    streams = [draw(parallel.data_rng(7, r, step)) for r, step in ((0, 0), (1, 0), (2, 0), (1, 50))]
    assert len({tuple(s) for s in streams}) == 4                                  # all different
    assert draw(parallel.data_rng(7, 1)) == draw(parallel.data_rng(7, 1))         # and reproducible
    assert parallel.device_seed(7, 1) != parallel.device_seed(7, 2)


def test_started_by_mpiexec_without_mpi4py_is_one_line_from_rank_0(text_file, tmp_path):
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "from train.command import main; sys.exit(main(sys.argv[1:]))")
    for rank, expected in (("0", "python -m train: error: started by an MPI launcher as rank 0 of 2, but mpi4py "
                                 "is not installed: pip install -e \".[dist]\"\n"), ("1", "")):
        env = dict(os.environ, PMI_SIZE="2", PMI_RANK=rank)
        done = subprocess.run([sys.executable, "-c", code, "--data", text_file, "--out_dir", str(tmp_path)],
                              env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert (done.returncode, done.stderr, done.stdout) == (1, expected, "")


# ---------------------------------------------------------------------------
# two processes
# ---------------------------------------------------------------------------
@needs_mpi
def test_collectives_and_bucketed_averaging_over_two_processes():
    """dist_programs.py checks every result on every rank: all_reduce (four ops, three dtypes, a
    transposed tensor), broadcast from each root, the object collectives and GradAverager over
    three buckets, on the CPU and, through host copies, on the "strict" device."""
    devices = ["strict"] if importlib.util.find_spec("array_api_strict") else []
    done = mpiexec(2, PROGRAMS, "checks", *devices)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert f"rank {rank}: the checks passed on {', '.join(['cpu'] + devices)}" in done.stdout


@needs_mpi
def test_two_processes_train_as_one_on_the_same_global_batches(text_file, tmp_path, monkeypatch):
    """--shared_batches feeds both processes' slices of the one-process run's batches (batch 8 =
    4 + 4). The 20 losses match one process's to float32 rounding (the gradient of 8 rows is
    summed in another order), and match bit for bit one process that accumulates two
    micro-batches of 4, which does the very same arithmetic."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")                  # the same BLAS threads in every run: bit for bit
    common = ["--max_iters", "20", "--eval_interval", "10"]
    two = train_cmd(2, text_file, tmp_path / "two", *common, "--batch_size", "8", "--shared_batches")
    train_cmd(1, text_file, tmp_path / "one", *common, "--batch_size", "8")
    train_cmd(1, text_file, tmp_path / "accumulated", *common, "--batch_size", "4", "--gradient_accumulation_steps", "2")
    two_losses, one_losses = step_losses(tmp_path / "two"), step_losses(tmp_path / "one")
    assert len(two_losses) == 20 and two_losses[-1] < two_losses[0] - 0.1        # it trains
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(two_losses, step_losses(tmp_path / "accumulated"))
    assert two.stdout.count("done: 20 iters") == 1                                 # rank 0 alone reports
    assert "data parallel over 2 processes, 4 of the 8 rows of each batch on each" in two.stdout


@needs_mpi
def test_two_processes_train_the_modern_block_as_one(text_file, tmp_path, monkeypatch):
    """Rotary, RMSNorm, SwiGLU, GQA, QK-norm, untied: the gradients of its extra parameters (the
    norms on q and k, the gate, the head) are averaged as every other one is."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")
    common = ["--max_iters", "8", "--eval_interval", "8", "--batch_size", "8", "--pos", "rope", "--norm", "rmsnorm",
              "--mlp", "swiglu", "--n_kv_head", "1", "--qk_norm", "true", "--tie_embeddings", "false"]
    train_cmd(2, text_file, tmp_path / "two", *common, "--shared_batches")
    train_cmd(1, text_file, tmp_path / "one", *common)
    np.testing.assert_allclose(step_losses(tmp_path / "two"), step_losses(tmp_path / "one"), rtol=1e-6, atol=0)


@needs_mpi
def test_resume_over_two_processes_is_exact_and_works_with_any_number(text_file, tmp_path):
    """Each process draws its own batches (not one process's); --resume over the same number
    continues every stream exactly; a one-process --resume of the same checkpoint trains on."""
    common = ["--batch_size", "8", "--eval_interval", "5", "--lr_decay_iters", "20"]
    train_cmd(2, text_file, tmp_path / "straight", *common, "--max_iters", "12")
    train_cmd(2, text_file, tmp_path / "stopped", *common, "--max_iters", "6")
    train_cmd(2, text_file, tmp_path / "stopped", "--resume", "--max_iters", "12")
    straight = step_losses(tmp_path / "straight")
    np.testing.assert_array_equal(step_losses(tmp_path / "stopped"), straight)
    train_cmd(1, text_file, tmp_path / "one", *common, "--max_iters", "12")
    assert not np.array_equal(step_losses(tmp_path / "one"), straight)            # their own batches
    train_cmd(1, text_file, tmp_path / "stopped", "--resume", "--max_iters", "16")
    resumed = step_losses(tmp_path / "stopped")
    assert len(resumed) == 16 and np.isfinite(resumed).all()


@needs_mpi
def test_a_batch_that_does_not_split_is_refused_in_one_line(text_file, tmp_path):
    done = mpiexec(2, "-m", "train", "--data", text_file, "--out_dir", str(tmp_path), "--batch_size", "5")
    assert done.returncode != 0
    assert done.stderr == ("python -m train: error: --batch_size 5 is the global batch and must split evenly "
                           "over the 2 processes: use a multiple of 2 (see --help)\n")


@needs_mpi
def test_a_rank_that_raises_ends_the_job_and_says_which(text_file, tmp_path):
    done = mpiexec(2, PROGRAMS, "fail", "raise", "3", "--data", text_file, "--out_dir", str(tmp_path),
                   *TINY, "--batch_size", "8", "--max_iters", "200")
    assert done.returncode != 0
    assert "python -m train: rank 1 failed: RuntimeError: a failure made on purpose at step 3" in done.stderr


@needs_mpi
def test_a_killed_rank_ends_the_job_and_resume_carries_on(text_file, tmp_path):
    """Rank 1 dies by SIGKILL at step 7, after the checkpoint of step 5: mpiexec ends the job
    (no hang) and names the dead process's pid, which the run's first line maps to rank 1."""
    done = mpiexec(2, PROGRAMS, "fail", "kill", "7", "--data", text_file, "--out_dir", str(tmp_path),
                   *TINY, "--batch_size", "8", "--max_iters", "200", "--eval_interval", "5")
    assert done.returncode != 0
    pid_of_rank_1 = done.stdout.split("1: pid ")[1].split()[0]
    assert f"PID {pid_of_rank_1} " in done.stdout + done.stderr
    assert checkpoint.read_meta(str(tmp_path / "ckpt.npz"))["step"] == 5
    train_cmd(2, text_file, tmp_path, "--resume", "--max_iters", "10")
    assert len(step_losses(tmp_path)) == 10


@needs_mpi
def test_sigterm_to_mpiexec_saves_the_step_reached(text_file, tmp_path):
    """kill -TERM to mpiexec (what Slurm and timeout send): mpiexec passes it on, rank 0 finishes
    the step, saves as Ctrl-C does, and ends the job with 143; --resume carries on."""
    job = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "train", "--data", text_file, "--out_dir",
                            str(tmp_path), *TINY, "--batch_size", "8", "--max_iters", "100000", "--eval_interval", "5"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + TIMEOUT
        while not (tmp_path / "ckpt.npz").exists() and time.time() < deadline:     # the eval at step 5 saved
            time.sleep(0.05)
        job.send_signal(signal.SIGTERM)
        out, err = job.communicate(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, out + err
    step = checkpoint.read_meta(str(tmp_path / "ckpt.npz"))["step"]
    assert 5 <= step < 100000 and f"python -m train: stopped by SIGTERM at step {step}: saved" in err, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == "SIGTERM" and summary["iters"] == step
    train_cmd(2, text_file, tmp_path, "--resume", "--max_iters", str(step + 5))
    assert len(step_losses(tmp_path)) == step + 5


def test_processes_on_one_machine_share_its_cores_unless_told():
    from train.__main__ import share_the_cores
    env = {"MPI_LOCALNRANKS": "2"}
    assert share_the_cores(env, 8) == 4 and env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "4"
    env = {"OMPI_COMM_WORLD_LOCAL_SIZE": "3"}
    assert share_the_cores(env, 2) == 1 and env["MKL_NUM_THREADS"] == "1"
    for env in ({"MPI_LOCALNRANKS": "2", "OMP_NUM_THREADS": "2"}, {"MPI_LOCALNRANKS": "1"}, {}):
        before = dict(env)
        assert share_the_cores(env, 8) is None and env == before                 # told, alone, or no mpiexec


# ---------------------------------------------------------------------------
# CUDA (skipped without a GPU; CI has none)
# ---------------------------------------------------------------------------
def gpu_count():
    return ta.backend.get_backend("cuda").xp.cuda.runtime.getDeviceCount() if ta.cuda_is_available() else 0


@pytest.mark.gpu
@needs_mpi
def test_cuda_tensors_through_host_copies_on_one_gpu():
    """Without init(device="cuda") CUDA tensors go through the host and MPI (both processes may share a GPU)."""
    done = mpiexec(2, PROGRAMS, "checks", "cuda-staged")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 1: the checks passed on cpu, cuda-staged" in done.stdout


@pytest.mark.gpu
@needs_mpi
def test_nccl_with_a_gpu_per_process_and_training_on_it(text_file, tmp_path):
    if gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs (NCCL takes one GPU per process), this machine has {gpu_count()}")
    done = mpiexec(2, PROGRAMS, "checks", "cuda")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 1: the checks passed on cpu, cuda" in done.stdout
    common = ["--max_iters", "20", "--eval_interval", "10", "--batch_size", "8", "--device", "cuda"]
    train_cmd(2, text_file, tmp_path / "two", *common, "--shared_batches")
    train_cmd(1, text_file, tmp_path / "one", *common)
    np.testing.assert_allclose(step_losses(tmp_path / "two"), step_losses(tmp_path / "one"), rtol=1e-5)


@needs_mpi
def test_the_benchmark_runs_and_reports_its_fields():
    """bench/bench_dist.py on its tiny config (no timing is checked: that is the benchmark's job)."""
    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_dist.py"), "--config", "tiny",
                           "--steps", "2", "--warmup", "1", "--threads", "1", "--mpiexec", MPIEXEC],
                          capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["bench"], r.get("processes")) for r in lines] == [("machine", None), ("dist_step", 1),
                                                                  ("dist_step", 2), ("allreduce_alone", 2)]
    one, two, alone = lines[1:]
    gradient_bytes = 4 * sum(p.numel() for p in ta.models.GPT(ta.models.GPTConfig(
        n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=65)).parameters())
    assert (one["bytes_reduced_per_step"], two["bytes_reduced_per_step"], alone["bytes"]) == \
        (0, gradient_bytes, gradient_bytes)
    assert two["tokens_per_s"] > 0 and two["allreduce_ms"] >= 0 and len(two["allreduce_ms_per_rank"]) == 2
