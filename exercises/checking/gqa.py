"""The checks of exercise 3 of EXERCISES.md: GQA."""
import tinyattn as ta
import tinyattn.nn.functional as F

from .common import autodiff_gradcheck, close, double, need, raises, rand, rng_


def gqa_with_one_group_per_head_is_mha(mod):
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q, k, v = rand(rng, 2, 4, 5, 8), rand(rng, 2, 4, 5, 8), rand(rng, 2, 4, 5, 8)
    for causal in (False, True):
        close(gqa(q, k, v, is_causal=causal), F.scaled_dot_product_attention(q, k, v, is_causal=causal),
              what=f"gqa with one k/v head per q head (causal={causal}) against multi-head attention, q {q.shape}")


def gqa_with_one_group_is_mqa(mod):
    """Multi-query attention: every query head reads the same single key/value head."""
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q, k, v = rand(rng, 2, 4, 5, 8), rand(rng, 2, 1, 5, 8), rand(rng, 2, 1, 5, 8)
    out = gqa(q, k, v, is_causal=True).numpy()
    for h in range(4):
        close(out[:, h:h + 1], F.scaled_dot_product_attention(q[:, h:h + 1], k, v, is_causal=True),
              what=f"head {h} with one shared k/v head (multi-query attention)")


def gqa_groups_consecutive_heads(mod):
    """With H = 6 and G = 2, heads 0-2 read group 0 and heads 3-5 group 1."""
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q, k, v = rand(rng, 1, 6, 4, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    out = gqa(q, k, v, is_causal=False).numpy()
    for h in range(6):
        g = h // 3
        close(out[:, h:h + 1], F.scaled_dot_product_attention(q[:, h:h + 1], k[:, g:g + 1], v[:, g:g + 1]),
              what=f"head {h} against k/v head {g} (consecutive q heads share a k/v head)")


def gqa_shapes(mod):
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q, k, v = rand(rng, 3, 8, 7, 4), rand(rng, 3, 2, 7, 4), rand(rng, 3, 2, 7, 4)
    assert gqa(q, k, v).shape == (3, 8, 7, 4)
    raises(ValueError, lambda: gqa(q, rand(rng, 3, 3, 7, 4), rand(rng, 3, 3, 7, 4)),
           "8 query heads do not split into 3 groups")


def gqa_gradcheck(mod):
    gqa, rng = need(mod, "grouped_query_attention"), rng_()
    q = rand(rng, 1, 4, 3, 4, grad=True)
    k, v = rand(rng, 1, 2, 3, 4, grad=True), rand(rng, 1, 2, 3, 4, grad=True)
    autodiff_gradcheck("the gradients of grouped_query_attention(q (1, 4, 3, 4), k, v (1, 2, 3, 4), causal)",
                       lambda q, k, v: gqa(q, k, v, is_causal=True), (q, k, v), ("q", "k", "v"))


def gqa_module(mod):
    GQA, rng = need(mod, "GroupedQueryAttention"), rng_()
    C, H, G = 16, 4, 2
    m = GQA(C, H, G, bias=False)
    n = sum(p.numel() for p in m.parameters())
    assert n == 2 * C * C + 2 * C * G * (C // H), \
        f"expected {2 * C * C + 2 * C * G * (C // H)} parameters (q and out: C x C, k and v: C x G*D), got {n}"
    double(m)
    x = rand(rng, 2, 5, C)
    y = m(x)
    assert y.shape == (2, 5, C)
    x2 = x.numpy().copy()
    x2[:, 3:] += 1.0                                                  # change the future only
    close(m(ta.tensor(x2, dtype="float64")).numpy()[:, :3], y.numpy()[:, :3],
          what="the first 3 positions after later tokens changed (the module must be causal)")
    xg = rand(rng, 1, 3, C, grad=True)
    autodiff_gradcheck(f"the gradients of GroupedQueryAttention({C}, {H}, {G})(x (1, 3, {C}))",
                       lambda x, *params: m(x), (xg, *m.parameters()), ("x", *(n for n, _ in m.named_parameters())))


CHECKS = [gqa_with_one_group_per_head_is_mha, gqa_with_one_group_is_mqa, gqa_groups_consecutive_heads, gqa_shapes,
       gqa_gradcheck, gqa_module]
