"""scaled_dot_product_attention's two paths: which one runs, and that the tiled one does all the naive one does."""
import contextlib
import tracemalloc
import warnings

import numpy as np
import pytest

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.models import GPT, GPTConfig
from tinyattn.fast import threads as fast_threads
from tinyattn.nn import attention, flash
from tinyattn.nn.flash import FlashAttention


def _tensors(rng, B, H, Tq, Tk, D=8, Dv=8, dtype="float64", device="cpu"):
    """q, k, v that require grad, and a cotangent u for the output."""
    shapes = [(B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv)]
    q, k, v = (ta.tensor(rng.standard_normal(s), dtype=dtype, device=device, requires_grad=True) for s in shapes)
    return q, k, v, ta.tensor(rng.standard_normal((B, H, Tq, Dv)), dtype=dtype, device=device)


def _run(q, k, v, u, **kwargs):
    """[out, dq, dk, dv] of scaled_dot_product_attention(q, k, v, **kwargs), as numpy arrays."""
    for t in (q, k, v):
        t.grad = None
    out = attention.attend(q, k, v, **kwargs)          # (sdpa, taking a mask and is_causal together)
    out.backward(u)
    return [out.numpy()] + [t.grad.numpy() for t in (q, k, v)]


def _as(dtype, *tensors):
    return [ta.tensor(t.numpy(), dtype=dtype, requires_grad=t.requires_grad) for t in tensors]


def _rel_errors(got, exact):
    """max |a - b| / max |b| for each array, with the scale taken over all of them (an exact 0
    gradient, as with a single key, comes out of float32 arithmetic as about 1e-8)."""
    scale = max(float(np.max(np.abs(b))) for b in exact if b.size)
    return [float(np.max(np.abs(a - b))) / scale if b.size else 0.0 for a, b in zip(got, exact)]


@pytest.fixture
def count_tiled(monkeypatch):
    """A list that gets one entry per FlashAttention forward."""
    calls = []
    original = FlashAttention.forward

    def counting(self, q, *args, **kwargs):
        calls.append(q.shape)
        return original(self, q, *args, **kwargs)

    monkeypatch.setattr(FlashAttention, "forward", counting)
    return calls


# ------------------------------------------------------------------ dispatch
@pytest.mark.parametrize("B,H,Tq,Tk,expected", [
    (1, 8, 64, 64, "naive"),           # short: the (T, T) scores are cheap
    (1, 8, 512, 512, "naive"),         # measured on 2 cores: naive is faster up to about T = 1024
    (1, 8, 1023, 1024, "naive"),
    (1, 8, 1024, 1024, "tiled"),       # long: tiles are as fast or faster, and O(T) in memory
    (1, 8, 4096, 4096, "tiled"),
    (4, 8, 1, 4096, "naive"),          # one new token against a KV cache: one row of scores
    (64, 64, 128, 128, "naive"),
    (128, 64, 128, 128, "tiled"),      # short, but 512 MiB of scores: too big to build
])
def test_auto_picks_the_path_by_size(B, H, Tq, Tk, expected):
    q, k = ta.zeros(B, H, Tq, 1), ta.zeros(B, H, Tk, 1)
    assert attention.attention_impl(q, k) == expected


def test_off_the_cpu_auto_waits_for_longer_sequences():
    pytest.importorskip("array_api_strict")
    short, long = ta.zeros(1, 8, 1024, 1, device="strict"), ta.zeros(1, 8, 2048, 1, device="strict")
    assert attention.attention_impl(short, short) == "naive"
    assert attention.attention_impl(long, long) == "tiled"


def test_auto_keeps_naive_for_weights_and_learned_masks():
    q = ta.zeros(1, 1, 2048, 1)
    assert attention.attention_impl(q, q) == "tiled"
    assert attention.attention_impl(q, q, return_weights=True) == "naive"
    assert attention.attention_impl(q, q, dropout_p=0.1) == "tiled"
    assert attention.attention_impl(q, q, attn_mask=ta.zeros(2048, 2048)) == "tiled"
    assert attention.attention_impl(q, q, attn_mask=ta.zeros(2048, 2048, requires_grad=True)) == "naive"
    assert attention.attention_impl(q, q, impl="naive") == "naive"
    assert attention.attention_impl(ta.zeros(1, 1, 4, 1), q, impl="tiled") == "tiled"


def test_the_path_said_is_the_path_run_and_both_agree(count_tiled, rng, monkeypatch):
    """With the threshold at 256 x 256 (to keep this test small), auto runs the tiled op at T=256
    and not at T=200; forcing either gives the same numbers."""
    monkeypatch.setattr(attention, "TILED_MIN_SCORES", 256 * 256)
    for T, tiled in ((200, False), (256, True)):
        q, k, v, u = _tensors(rng, 1, 2, T, T)
        count_tiled.clear()
        auto = _run(q, k, v, u, is_causal=True)
        assert len(count_tiled) == (1 if tiled else 0), T
        other = _run(q, k, v, u, is_causal=True, impl="naive" if tiled else "tiled")
        for name, a, b in zip(("out", "dq", "dk", "dv"), auto, other):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=f"T={T} {name}")


def test_tiled_refuses_what_it_cannot_do():
    q = ta.randn(1, 1, 4, 2)
    with pytest.raises(ValueError, match="impl='naive'"):
        F.scaled_dot_product_attention(q, q, q, return_weights=True, impl="tiled")
    with pytest.raises(ValueError, match="dropout_p"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=1.0, impl="tiled")
    with pytest.raises(ValueError, match="gradient"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=ta.zeros(4, 4, requires_grad=True), impl="tiled")
    with pytest.raises(ValueError, match=r"attn_mask \(3, 4\) does not broadcast to \(B, H, Tq, Tk\) = \(1, 1, 4, 4\)"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=ta.zeros(3, 4), impl="tiled")
    with pytest.raises(ValueError, match="impl must be"):
        F.scaled_dot_product_attention(q, q, q, impl="flash")


def test_double_backward_needs_the_naive_path(rng, monkeypatch):
    """Auto takes the tiled path at long T, whose backward is fused: create_graph names it; naive works."""
    monkeypatch.setattr(attention, "TILED_MIN_SCORES", 256 * 256)      # T = 256 counts as long here
    q, k, v, _ = _tensors(rng, 1, 1, 256, 256, D=2, Dv=2)
    with pytest.raises(RuntimeError, match="FlashAttention has a fused backward"):
        ta.grad(F.scaled_dot_product_attention(q, k, v).sum(), q, create_graph=True)
    (g,) = ta.grad((F.scaled_dot_product_attention(q, k, v, impl="naive") ** 2).sum(), q, create_graph=True)
    (gg,) = ta.grad(g.sum(), q)
    assert gg.shape == q.shape and np.all(np.isfinite(gg.numpy()))


# ------------------------------------------------------------------ features: tiled against naive
# (each runs twice through the cpu_kernels fixture: with the fused tile kernels and with the numpy formulas)
def _masks(rng, B, H, Tq, Tk):
    """name -> attn_mask (a Tensor) of several kinds and broadcast shapes."""
    bool_full = rng.random((B, H, Tq, Tk)) > 0.3
    bool_full[..., 0] = True                                      # every row sees a key, for the causal case too
    padding = np.ones((B, 1, 1, Tk), bool)
    padding[:, :, :, Tk - Tk // 3:] = False                       # the last keys are padding
    return {
        "none": None,
        "bool (B, H, Tq, Tk)": ta.tensor(bool_full),
        "bool (Tq, Tk)": ta.tensor(bool_full[0, 0]),
        "bool padding (B, 1, 1, Tk)": ta.tensor(padding),
        "additive (Tq, Tk)": ta.tensor(rng.standard_normal((Tq, Tk)), dtype="float64"),
        "additive (1, H, Tq, 1)": ta.tensor(rng.standard_normal((1, H, Tq, 1)), dtype="float64"),
    }


# (B, H, Tq, Tk), block size: T not a multiple of the tile, T = 1, Tq < Tk (a KV cache), Tq > Tk
SHAPES = [((2, 3, 37, 37), 8), ((1, 2, 1, 1), 4), ((1, 1, 1, 29), 8), ((2, 2, 19, 45), 8), ((1, 2, 45, 19), 16),
          ((1, 2, 300, 300), 256)]
FEATURES = [(shape, bs, causal, mask) for shape, bs in SHAPES for causal in (False, True)
            for mask in _masks(np.random.default_rng(0), 1, 1, 1, 2)]


@pytest.mark.parametrize("shape,block_size,causal,mask", FEATURES,
                         ids=[f"{'x'.join(map(str, s))}-bs{b}-{'causal' if c else 'full'}-{m}" for s, b, c, m in FEATURES])
def test_tiled_matches_naive_float64(shape, block_size, causal, mask, monkeypatch, cpu_kernels):
    rng = np.random.default_rng(sum(shape))
    monkeypatch.setattr(flash, "BLOCK_SIZE", block_size)
    q, k, v, u = _tensors(rng, *shape)
    m = _masks(rng, *shape)[mask]
    tiled = _run(q, k, v, u, attn_mask=m, is_causal=causal, impl="tiled")
    naive = _run(q, k, v, u, attn_mask=m, is_causal=causal, impl="naive")
    for name, a, b in zip(("out", "dq", "dk", "dv"), tiled, naive):
        assert np.all(np.isfinite(a)), name
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("shape,block_size,causal,mask", FEATURES,
                         ids=[f"{'x'.join(map(str, s))}-bs{b}-{'causal' if c else 'full'}-{m}" for s, b, c, m in FEATURES])
def test_tiled_float32_is_as_close_to_float64_as_naive_float32(shape, block_size, causal, mask, monkeypatch, cpu_kernels):
    """Both float32 paths against the float64 result: the tiled one within 1e-5 relative, as accurate as naive."""
    rng = np.random.default_rng(sum(shape) + 1)
    monkeypatch.setattr(flash, "BLOCK_SIZE", block_size)
    q, k, v, u = _tensors(rng, *shape)
    m = _masks(rng, *shape)[mask]
    exact = _run(q, k, v, u, attn_mask=m, is_causal=causal, impl="naive")
    q32, k32, v32, u32 = _as("float32", q, k, v, u)
    m32 = None if m is None else ta.tensor(m.numpy(), dtype="float32" if m.dtype.kind == "f" else None)
    tiled = _run(q32, k32, v32, u32, attn_mask=m32, is_causal=causal, impl="tiled")
    naive = _run(q32, k32, v32, u32, attn_mask=m32, is_causal=causal, impl="naive")
    assert all(a.dtype == np.float32 for a in tiled)
    errors, naive_errors = _rel_errors(tiled, exact), _rel_errors(naive, exact)
    assert max(errors) < 1e-5, dict(tiled=errors, naive=naive_errors)


@pytest.mark.parametrize("dtype,rtol,atol", [("float64", 1e-10, 1e-12), ("float32", 1e-4, 1e-5)])
@pytest.mark.parametrize("causal", [False, True])
def test_fully_masked_rows_give_zeros_and_zero_gradients(causal, dtype, rtol, atol, rng, monkeypatch, cpu_kernels):
    """Rows 0 and 5 may see no key: output 0 (not NaN), no gradient through them; the rest match naive."""
    monkeypatch.setattr(flash, "BLOCK_SIZE", 4)
    q, k, v, u = _tensors(rng, 1, 2, 9, 9, dtype=dtype)
    mask = np.ones((9, 9), bool)
    mask[0] = mask[5] = False
    mask = ta.tensor(mask)
    tiled = _run(q, k, v, u, attn_mask=mask, is_causal=causal, impl="tiled")
    naive = _run(q, k, v, u, attn_mask=mask, is_causal=causal, impl="naive")
    out, dq = tiled[0], tiled[1]
    assert np.all(out[:, :, [0, 5]] == 0) and np.all(dq[:, :, [0, 5]] == 0)
    for name, a, b in zip(("out", "dq", "dk", "dv"), tiled, naive):
        assert np.all(np.isfinite(a)) and a.dtype == dtype, name
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)


def test_a_minus_inf_additive_mask_row_gives_zeros(rng):
    q, k, v, u = _tensors(rng, 1, 1, 6, 6)
    bias = np.zeros((6, 6))
    bias[2] = -np.inf
    out = _run(q, k, v, u, attn_mask=ta.tensor(bias, dtype="float64"), impl="tiled")
    assert np.all(np.isfinite(out[0])) and np.all(out[0][:, :, 2] == 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", ["none", "bool (B, H, Tq, Tk)", "additive (1, H, Tq, 1)"])
def test_tiled_gradcheck(causal, mask, cpu_kernels):
    """float64 gradcheck with tiles of 3 on sizes that several tiles cover, unevenly."""
    rng = np.random.default_rng(7)
    q, k, v, _ = _tensors(rng, 2, 2, 7, 8, D=3, Dv=2)
    m = _masks(rng, 2, 2, 7, 8)[mask]
    assert ta.gradcheck(lambda a, b, c: F.flash_attention(a, b, c, is_causal=causal, attn_mask=m, block_size=3),
                        (q, k, v))


@contextlib.contextmanager
def num_threads(n):
    """ta.set_num_threads(n) for a block, put back after."""
    before = ta.get_num_threads()
    ta.set_num_threads(n)
    try:
        yield
    finally:
        ta.set_num_threads(before)


def test_threads_and_no_threadpoolctl_give_the_same_numbers(rng, monkeypatch):
    """One head per piece of work over 1 or 2 threads, and in order without threadpoolctl: identical results."""
    q, k, v, u = _tensors(rng, 2, 3, 40, 40)
    one = _run(q, k, v, u, is_causal=True, impl="tiled")
    for threads in (1, 2, 3):
        for t in (q, k, v):
            t.grad = None
        with num_threads(threads):
            out = F.flash_attention(q, k, v, is_causal=True, block_size=16)
            out.backward(u)
        got = [out.numpy()] + [t.grad.numpy() for t in (q, k, v)]
        for a, b in zip(got, one):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    monkeypatch.setattr(fast_threads, "_blas", ())                # as if threadpoolctl were not installed
    monkeypatch.setattr(fast_threads, "_warned", True)
    assert not fast_threads.blas_controllers()
    for a, b in zip(_run(q, k, v, u, is_causal=True, impl="tiled"), one):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.usefixtures("fast_layer_on")
def test_without_threadpoolctl_a_warning_says_so_once(rng, monkeypatch):
    """The heads then run one after another: slower, so say it (once per process), and how to fix it."""
    q, k, v, u = _tensors(rng, 1, 3, 20, 20)
    monkeypatch.setattr(fast_threads, "_blas", ())
    monkeypatch.setattr(fast_threads, "_warned", False)
    with num_threads(2), pytest.warns(RuntimeWarning, match=r"runs its 3 heads one after another.*pip install "
                                                            "threadpoolctl"):
        F.flash_attention(q, k, v).backward(u)
    with num_threads(2), warnings.catch_warnings():
        warnings.simplefilter("error")
        F.flash_attention(q, k, v)                                # said once is enough
    monkeypatch.setattr(fast_threads, "_warned", False)
    with num_threads(1), warnings.catch_warnings():
        warnings.simplefilter("error")
        F.flash_attention(q, k, v)                                # one thread asked for: nothing is lost


def test_stand_in_device_runs_the_tiled_path(count_tiled):
    """array_api_strict (no out=, no threads, all heads at once): same numbers as numpy, with a mask and Tq != Tk."""
    pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(11)
    q, k, v, u = _tensors(rng, 2, 2, 11, 14)
    mask = rng.random((2, 1, 11, 14)) > 0.3
    mask[0, 0, 3] = False                                         # a fully masked row
    mask &= np.tril(np.ones((11, 14), bool))                      # causal too (sdpa takes one or the other)
    on_cpu = _run(q, k, v, u, attn_mask=ta.tensor(mask), impl="tiled")
    strict = [ta.tensor(t.numpy(), dtype="float64", device="strict", requires_grad=t.requires_grad) for t in (q, k, v, u)]
    count_tiled.clear()
    on_device = _run(*strict, attn_mask=ta.tensor(mask, device="strict"), impl="tiled")
    assert len(count_tiled) == 1
    for a, b in zip(on_device, on_cpu):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ dropout on the tiled path
def _dropout_reference(q, k, v, keep, p, causal, mask):
    """(softmax(q k^T scale + mask) * keep / (1 - p)) v with Tensor ops: the naive formula, a given mask."""
    scores = (q * (1.0 / np.sqrt(q.shape[-1]))) @ k.mT               # (B, H, Tq, Tk)
    allowed = np.ones(scores.shape, bool)
    if causal:
        allowed &= np.tril(np.ones(scores.shape[-2:], bool))
    if mask is not None:
        allowed &= mask
    weights = F.softmax(ta.where(ta.tensor(allowed), scores, ta.tensor(-np.inf, dtype="float64")), -1)
    return (weights * ta.tensor(keep / (1.0 - p), dtype="float64")) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_dropout_matches_the_formula_with_the_same_mask(causal, rng, monkeypatch):
    """The tiles' dropout masks, gathered into one (B, H, Tq, Tk) array, give naive's numbers and gradients."""
    B, H, Tq, Tk, p = 2, 2, 13, 17, 0.3
    q, k, v, u = _tensors(rng, B, H, Tq, Tk)
    mask = rng.random((B, 1, Tq, Tk)) > 0.2
    mask[..., 0] = True
    keep = np.zeros((B, H, Tq, Tk))
    original = FlashAttention._keep

    def recording(self, item, i0, j0, shape):                     # record each tile's mask where it lands
        z = original(self, item, i0, j0, shape)
        keep[item][..., i0:i0 + shape[-1], j0:j0 + shape[-2]] = np.swapaxes(z, -1, -2) * (1.0 - p)
        return z

    monkeypatch.setattr(FlashAttention, "_keep", recording)
    ta.manual_seed(3)
    tiled = _run(q, k, v, u, attn_mask=ta.tensor(mask), is_causal=causal, dropout_p=p, impl="tiled")
    monkeypatch.setattr(FlashAttention, "_keep", original)
    seen = np.broadcast_to(np.tril(np.ones((Tq, Tk), bool)) if causal else True, keep.shape)  # tiles drawn
    dropped = 1.0 - keep[seen].mean()
    assert 0.2 < dropped < 0.4, dropped                           # about p of the weights
    for t in (q, k, v):
        t.grad = None
    out = _dropout_reference(q, k, v, keep, p, causal, mask)
    out.backward(u)
    naive = [out.numpy()] + [t.grad.numpy() for t in (q, k, v)]
    for name, a, b in zip(("out", "dq", "dk", "dv"), tiled, naive):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=name)


def test_tiled_dropout_gradcheck_and_seeding():
    """With the generator seeded, forward and backward see the same masks (gradcheck), and a new
    seed gives new masks."""
    rng = np.random.default_rng(8)
    q, k, v, _ = _tensors(rng, 1, 2, 7, 9, D=3, Dv=2)

    def fn(a, b, c):
        ta.manual_seed(5)
        return F.flash_attention(a, b, c, is_causal=True, dropout_p=0.4, block_size=3)
    assert ta.gradcheck(fn, (q, k, v))
    ta.manual_seed(5)
    first = F.flash_attention(q, k, v, dropout_p=0.4, block_size=3).numpy()
    ta.manual_seed(5)
    again = F.flash_attention(q, k, v, dropout_p=0.4, block_size=3).numpy()
    other = F.flash_attention(q, k, v, dropout_p=0.4, block_size=3).numpy()
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)


# ------------------------------------------------------------------ memory
def test_tiled_memory_stays_far_below_t_squared():
    """Causal forward + backward at T=4096 through the default call: naive would hold (T, T) scores and
    weights (64 MiB each in float32); the tiled path's peak growth is a few (T, D) arrays and 256 x 256 tiles
    (about 5 MiB measured)."""
    T, D = 4096, 16
    rng = np.random.default_rng(0)
    q, k, v = (ta.tensor(rng.standard_normal((1, 1, T, D)), dtype="float32", requires_grad=True) for _ in range(3))
    u = ta.tensor(rng.standard_normal((1, 1, T, D)), dtype="float32")
    tracemalloc.start()
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(u)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    t_squared = T * T * 4
    assert peak < t_squared / 8, f"peak {peak / 2 ** 20:.1f} MiB; one (T, T) float32 array is {t_squared / 2 ** 20:.0f} MiB"


# ------------------------------------------------------------------ the GPT through the tiled path
def _gpt(block_size=40):
    ta.manual_seed(0)
    return GPT(GPTConfig(block_size=block_size, vocab_size=23, n_layer=2, n_head=2, n_embd=16))


def test_gpt_trains_through_the_tiled_path(count_tiled, monkeypatch):
    """A long block: auto takes the tiled path in every layer, with the same loss and gradients as naive."""
    model = _gpt(block_size=300)
    idx = ta.tensor(np.random.default_rng(1).integers(0, 23, (2, 301)))
    results = {}
    for impl, threshold in (("tiled", 300 * 300), ("naive", 10 ** 12)):
        monkeypatch.setattr(attention, "TILED_MIN_SCORES", threshold)
        model.zero_grad()
        count_tiled.clear()
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        assert len(count_tiled) == (2 if impl == "tiled" else 0)
        results[impl] = [loss.numpy()] + [p.grad.numpy() for p in model.parameters()]
    for a, b in zip(results["tiled"], results["naive"]):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


def test_generate_with_the_kv_cache_uses_the_tiled_path(count_tiled, monkeypatch):
    """Every attention call tiled (prefill with the cache's mask, then one query against the cache):
    the same greedy tokens as the naive path, and the same as without a cache."""
    model = _gpt().eval()
    prompt = ta.tensor(np.random.default_rng(2).integers(0, 23, (2, 9)))
    monkeypatch.setattr(attention, "TILED_MIN_SCORES", 1)
    tiled = model.generate(prompt, 12, temperature=0).numpy()
    assert len(count_tiled) == 2 * 12                             # 2 layers, 12 steps
    no_cache = model.generate(prompt, 12, temperature=0, use_cache=False).numpy()
    monkeypatch.setattr(attention, "TILED_MIN_SCORES", 10 ** 12)
    naive = model.generate(prompt, 12, temperature=0).numpy()
    np.testing.assert_array_equal(tiled, naive)
    np.testing.assert_array_equal(tiled, no_cache)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_runs_the_threaded_path():
    """After fork the parent's pool threads are gone; the child must not wait on them forever."""
    import multiprocessing
    q = ta.randn(1, 4, 300, 8)
    with num_threads(2):
        F.flash_attention(q, q, q)                                # the parent's pool exists now
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        result = pool.apply_async(_tiled_sum, (q.numpy(),))
        assert np.isfinite(result.get(timeout=60))


def _tiled_sum(array):
    x = ta.tensor(array)
    with num_threads(2):
        return float(F.flash_attention(x, x, x).sum().item())


def test_gpt_with_dropout_trains_through_the_tiled_path(count_tiled, monkeypatch):
    monkeypatch.setattr(attention, "TILED_MIN_SCORES", 256 * 256)
    ta.manual_seed(0)
    model = GPT(GPTConfig(block_size=256, vocab_size=23, n_layer=2, n_head=2, n_embd=16, dropout=0.1))
    idx = ta.tensor(np.random.default_rng(1).integers(0, 23, (1, 257)))
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    assert len(count_tiled) == 2
    assert all(np.all(np.isfinite(p.grad.numpy())) for p in model.parameters())


def _run_dispatch_benchmark(*args):
    """bench/bench_dispatch.py with these arguments, run in the test's own folder: the finished process."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "bench" / "bench_dispatch.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)


def test_the_dispatch_benchmark_runs():
    """bench/bench_dispatch.py on a tiny shape prints one JSON line per shape (no timing is checked:
    that is the benchmark's job)."""
    import json
    done = _run_dispatch_benchmark("--shapes", "1,2,32", "2,1,16", "--repeats", "1")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["B"], r["H"], r["T"]) for r in rows] == [(1, 2, 32), (2, 1, 16)]
    assert all(r["naive_ms"] > 0 and r["tiled_ms"] > 0 and r["auto"] == "naive" for r in rows)


def test_the_dispatch_benchmark_says_in_one_line_when_torch_is_missing():
    """--paths torch without PyTorch installed: one line on stderr and a non-zero exit, no traceback."""
    import importlib.util
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed here")
    done = _run_dispatch_benchmark("--paths", "tiled", "torch", "--shapes", "1,1,8")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["bench_dispatch: --paths torch needs PyTorch in this Python "
                                                "(pip install torch)"]


def _attention_formula(q, k, v, mask):
    """softmax(q k^T / sqrt(D) + mask) v in numpy, float64; a boolean mask keeps what is True."""
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask.dtype == bool:
        scores = np.where(mask, scores, -np.inf)
    else:
        scores = scores + mask
    m = scores.max(-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(m), m, 0))
    total = e.sum(-1, keepdims=True)
    return (e / np.where(total > 0, total, 1)) @ v


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("shape", [(6,), (1, 6), (5, 6), (2, 1, 1, 6), (2, 3, 5, 6)],
                         ids=["(Tk,)", "(1, Tk)", "(Tq, Tk)", "(B, 1, 1, Tk)", "(B, H, Tq, Tk)"])
def test_every_mask_shape_the_docstring_allows_gives_the_formula(shape, kind, cpu_kernels):
    """With the CPU kernels on, a (1, Tk) key-padding mask crashed (the fused path declined with no
    fallback). Every broadcastable mask, boolean or additive, gives the formula, forward and backward."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s) for s in [(2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 4)])
    keep = rng.random(shape) > 0.3
    keep[..., 0] = True                                              # every query sees a key
    mask = keep if kind == "bool" else np.where(keep, rng.standard_normal(shape), -np.inf)
    for dtype, tol in (("float64", 1e-10), ("float32", 1e-5)):
        qt, kt, vt = (ta.tensor(a, dtype=dtype, requires_grad=True) for a in (q, k, v))
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=ta.tensor(mask, dtype=None if kind == "bool" else dtype))
        np.testing.assert_allclose(out.numpy(), _attention_formula(q, k, v, mask), rtol=tol, atol=tol)
        out.backward(ta.ones_like(out))
        assert all(np.isfinite(t.grad.numpy()).all() for t in (qt, kt, vt))
    qt, kt, vt = (ta.tensor(a, dtype="float64", requires_grad=True) for a in (q, k, v))
    m = ta.tensor(mask, dtype=None if kind == "bool" else "float64")
    assert ta.gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=m), (qt, kt, vt))
