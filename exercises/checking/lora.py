"""The checks of exercise 17 of EXERCISES.md: LoRA."""
import numpy as np

import tinyattn as ta

from .common import (AUTODIFF_HINT, ExerciseFailure, NotStarted, autodiff_gradcheck, close, compare, double, need,
                     rand, rng_)


def lora_layer(mod, r=2, alpha=8.0, d_in=6, d_out=5, bias=True, random_b=False):
    """A LoRALinear around a float64 Linear; with random_b, B random too (it starts at zero)."""
    import tinyattn.nn as nn
    LoRALinear = need(mod, "LoRALinear")
    ta.manual_seed(0)
    base = double(nn.Linear(d_in, d_out, bias=bias))
    m = double(LoRALinear(base, r, alpha))
    for name, shape in (("A", (r, d_in)), ("B", (d_out, r))):
        p = getattr(m, name, None)
        if p is None:
            raise NotStarted(f"LoRALinear has no {name} yet")
        if tuple(p.shape) != shape:
            raise ExerciseFailure(f"LoRALinear(Linear({d_in}, {d_out}), r={r}).{name} is {tuple(p.shape)}, "
                                  f"expected {shape}: A is (r, in_features), B is (out_features, r)")
    if random_b:
        m.B.data = ta.tensor(rng_().standard_normal(m.B.shape), dtype="float64").data
    return m


def lora_starts_as_the_base_layer(mod):
    m = lora_layer(mod)
    x = rand(rng_(), 3, 6)
    if not np.any(m.A.numpy()):
        raise ExerciseFailure("A starts at zero: then B's gradient (which goes through x A^T) is zero too and "
                              "nothing trains; start A random and B at zero")
    close(m(x), m.base(x), what="a new LoRALinear(base, r) against base(x) (B starts at zero, so the update is 0)")


def lora_matches_formula(mod):
    rng = rng_()
    x = rand(rng, 2, 3, 6)
    for r, alpha in ((2, 8.0), (3, None)):
        m = lora_layer(mod, r=r, alpha=alpha, random_b=True)
        scale = (r if alpha is None else alpha) / r
        W, b, A, B = (t.numpy() for t in (m.base.weight, m.base.bias, m.A, m.B))
        plain = x.numpy() @ W.T + b
        update = x.numpy() @ A.T @ B.T
        got = m(x).numpy()
        if scale != 1 and np.allclose(got, plain + update, atol=1e-10):
            raise ExerciseFailure(f"LoRALinear(base, r={r}, alpha={alpha}) leaves out the scale alpha / r = {scale:g}: "
                                  "the update is (alpha / r) * x A^T B^T")
        compare(got, plain + scale * update,
                f"LoRALinear(base, r={r}, alpha={alpha})(x) against base(x) + (alpha / r) x A^T B^T on x {x.shape}",
                hint="alpha defaults to r (a scale of 1)" if alpha is None else "")


def lora_trains_only_the_adapters(mod):
    m = lora_layer(mod, r=2, d_in=6, d_out=5, random_b=True)
    trainable = {n: p for n, p in m.named_parameters() if p.requires_grad}
    if any(p.requires_grad for p in m.base.parameters()):
        raise ExerciseFailure("base's weight still has requires_grad: it would get a gradient and the optimizer "
                              "would change it; set requires_grad = False on base's parameters")
    n = sum(p.numel() for p in trainable.values())
    assert n == 2 * (6 + 5), f"{n} trainable numbers, expected r * (in + out) = {2 * (6 + 5)}: A and B only"
    m(rand(rng_(), 3, 6)).sum().backward()
    if m.base.weight.grad is not None:
        raise ExerciseFailure("base.weight got a gradient: the frozen weight must not (requires_grad = False)")
    if m.A.grad is None or m.B.grad is None:
        raise ExerciseFailure("A or B got no gradient: build the update from them with tinyattn ops")


def lora_gradcheck(mod):
    m = lora_layer(mod, random_b=True)
    x = rand(rng_(), 2, 3, 6, grad=True)
    autodiff_gradcheck("the gradients of LoRALinear(Linear(6, 5), r=2, alpha=8)(x (2, 3, 6))", lambda x, A, B: m(x),
                       (x, m.A, m.B), ("x", "A", "B"),
                       hint="The frozen base needs no ta.no_grad(): requires_grad = False keeps its weight from a "
                            "gradient, while x still gets one through base(x), which the layers below train by. "
                            + AUTODIFF_HINT)


def lora_merge_keeps_the_logits(mod):
    import tinyattn.nn as nn
    from tinyattn.models import GPT, GPTConfig
    LoRALinear = need(mod, "LoRALinear")
    if not hasattr(LoRALinear, "merge"):
        raise NotStarted("LoRALinear has no merge yet")
    ta.manual_seed(0)
    model = double(GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8))).eval()
    rng = rng_()
    for block in model.h:                                 # adapt every block's qkv and first MLP projection
        for owner, name in ((block.attn, "c_attn"), (block.mlp, "c_fc")):
            layer = double(LoRALinear(getattr(owner, name), 2, 4.0))
            layer.B.data = ta.tensor(rng.standard_normal(layer.B.shape), dtype="float64").data
            setattr(owner, name, layer)
    idx = ta.tensor(rng.integers(0, 11, (2, 8)))
    adapted = model(idx)[0].numpy()
    for block in model.h:
        for owner, name in ((block.attn, "c_attn"), (block.mlp, "c_fc")):
            merged = getattr(owner, name).merge()
            if type(merged) is not nn.Linear:
                raise ExerciseFailure(f"merge() returned a {type(merged).__name__}, expected one nn.Linear")
            setattr(owner, name, merged)
    compare(model(idx)[0], adapted, "a GPT's logits with every adapter merged against the adapted GPT's",
            tol=1e-9, hint="merge's weight is W + (alpha / r) B A, and the bias is base's")


CHECKS = [lora_starts_as_the_base_layer, lora_matches_formula, lora_trains_only_the_adapters, lora_gradcheck,
        lora_merge_keeps_the_logits]
