"""The checks of exercise 14 of EXERCISES.md: online softmax."""
import math

import numpy as np

import tinyattn as ta

from .attention import np_attention
from .common import (DTYPE_RULE_OF_OPS, ExerciseFailure, attempt, compare, need, on_strict, peak_bytes, rand, rng_,
                     tensors, writes_no_input)


def np_tiled_without_rescale(q, k, v, block):
    """The typical wrong tiling: the running sums are never rescaled when the max grows."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = np.full(q.shape[:-1] + (1,), -np.inf)
    l, acc = np.zeros(q.shape[:-1] + (1,)), np.zeros(q.shape[:-1] + (v.shape[-1],))
    for j in range(0, k.shape[-2], block):
        s = q @ np.swapaxes(k[..., j:j + block, :], -1, -2) * scale
        m = np.maximum(m, s.max(-1, keepdims=True))
        p = np.exp(s - m)
        l, acc = l + p.sum(-1, keepdims=True), acc + p @ v[..., j:j + block, :]
    return acc / l


def online_softmax_matches_naive(mod):
    tiled, rng = need(mod, "tiled_attention"), rng_()
    for (tq, tk, block, causal) in [(10, 10, 4, False), (10, 10, 4, True), (7, 13, 5, False), (9, 9, 1, True),
                                    (6, 6, 16, True)]:
        q, k, v = rand(rng, 2, 2, tq, 8), rand(rng, 2, 2, tk, 8), rand(rng, 2, 2, tk, 3)
        what = f"tiled_attention(Tq={tq}, Tk={tk}, block_size={block}, is_causal={causal})"
        out = attempt(what, lambda: tiled(q, k, v, block_size=block, is_causal=causal))
        if not isinstance(out, ta.Tensor):
            raise ExerciseFailure(f"{what} returned a {type(out).__name__}, not a Tensor")
        compare(out, np_attention(q.numpy(), k.numpy(), v.numpy(), causal), f"{what} (against naive attention)",
                hint="At the end of the key blocks, out = acc / l.")
    q, k, v = rand(rng, 1, 2, 7, 8), rand(rng, 1, 2, 13, 8), rand(rng, 1, 2, 13, 3)
    what = "tiled_attention(Tq=7, Tk=13, block_size=5, scale=0.3)"
    compare(attempt(what, lambda: tiled(q, k, v, block_size=5, scale=0.3)),
            np_attention(q.numpy(), k.numpy(), v.numpy(), scale=0.3), f"{what} (against naive attention)",
            hint="Use the scale you are given (1 / sqrt(D) is only its default).")


def online_softmax_rescales(mod):
    """Later key blocks hold larger scores, so the running max grows: the old sums must be rescaled."""
    tiled, rng = need(mod, "tiled_attention"), rng_()
    q = ta.tensor(np.abs(rng.standard_normal((1, 1, 4, 8))) + 0.5, dtype="float64")
    k = ta.tensor(np.linspace(0.1, 3.0, 12)[:, None] * np.ones((1, 1, 12, 8)), dtype="float64")   # growing scores
    v = rand(rng, 1, 1, 12, 3)
    out = writes_no_input("tiled_attention with growing scores", lambda q, k, v: tiled(q, k, v, block_size=4),
                          [q, k, v], "qkv")
    expected = np_attention(q.numpy(), k.numpy(), v.numpy())
    if np.allclose(out.numpy(), np_tiled_without_rescale(q.numpy(), k.numpy(), v.numpy(), 4), atol=1e-9):
        raise ExerciseFailure("tiled_attention is wrong when a later key block raises a row's max: when m grows "
                              "to m_new, the sums l and acc so far were taken relative to the old m; multiply "
                              "them by exp(m - m_new) before adding the new tile")
    compare(out, expected, "tiled_attention with scores that grow from block to block (against naive attention)",
            hint="When a row's max grows from m to m_new, rescale l and acc by exp(m - m_new).")


def online_softmax_memory(mod):
    """With T = 512 the full score matrix is 2 MB; tiles of 32 x 32 need a few KB."""
    tiled, rng = need(mod, "tiled_attention"), rng_()
    q, k, v = rand(rng, 1, 1, 512, 8), rand(rng, 1, 1, 512, 8), rand(rng, 1, 1, 512, 8)
    used = peak_bytes(lambda: attempt("tiled_attention(T = 512, block_size=32)",
                                      lambda: tiled(q, k, v, block_size=32)))
    full = 512 * 512 * 8
    if used >= full / 2:
        raise ExerciseFailure(f"tiled_attention(T = 512, block_size=32) held {used / 2**20:.1f} MB at once; the "
                              f"whole (T, T) score matrix is {full / 2**20:.0f} MB: keep one (block, block) tile "
                              "of scores at a time, and per query row only m, l and acc")
    q, k, v = rand(rng, 1, 1, 32, 8), rand(rng, 1, 1, 4096, 8), rand(rng, 1, 1, 4096, 8)
    used = peak_bytes(lambda: attempt("tiled_attention(Tq = 32, Tk = 4096, block_size=32)",
                                      lambda: tiled(q, k, v, block_size=32)))
    strip = 32 * 4096 * 8
    if used >= strip / 4:
        raise ExerciseFailure(f"tiled_attention(Tq = 32, Tk = 4096, block_size=32) held {used / 2**20:.1f} MB at "
                              f"once; a block of queries against every key is {strip / 2**20:.0f} MB: go through the "
                              "keys one block at a time too, with the running m, l and acc of the online softmax")


def online_softmax_on_strict(mod):
    tiled, rng = need(mod, "tiled_attention"), rng_()
    arrays = [rng.standard_normal((1, 2, 7, 4)) for _ in range(3)]
    on_strict("tiled_attention (causal, block_size=3)",
              lambda d: [tiled(*tensors(d, *arrays, grad=False), block_size=3, is_causal=True)])


def online_softmax_keeps_float32(mod):
    tiled, rng = need(mod, "tiled_attention"), rng_()
    q, k, v = (ta.tensor(rng.standard_normal((1, 2, 7, 4)), dtype="float32") for _ in range(3))
    out = attempt("tiled_attention in float32", lambda: tiled(q, k, v, block_size=3, is_causal=True))
    if out.dtype != np.float32:
        raise ExerciseFailure(f"tiled_attention on float32 q, k, v returned {out.dtype}: {DTYPE_RULE_OF_OPS} "
                              "(backend.full(shape, value, q.dtype) makes m, l and acc in q's dtype)")


CHECKS = [online_softmax_rescales, online_softmax_matches_naive, online_softmax_memory,
                  online_softmax_keeps_float32,
                  online_softmax_on_strict]
