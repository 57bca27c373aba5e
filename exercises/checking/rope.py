"""The checks of exercise 2 of EXERCISES.md: RoPE."""
import numpy as np

import tinyattn as ta

from .common import autodiff_gradcheck, close, compare, need, rand, rng_


def rope_keeps_shape_and_dtype(mod):
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = ta.tensor(rng.standard_normal((2, 3, 5, 8)).astype(np.float32))
    y = apply_rotary(x, list(range(5)))
    assert y.shape == x.shape and y.dtype == x.dtype


def rope_position_zero_is_identity(mod):
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = rand(rng, 2, 4, 8)
    close(apply_rotary(x, [0, 0, 0, 0]), x, tol=1e-12, what=f"apply_rotary at position 0 (must leave x {x.shape} as it is)")


def rope_preserves_norms(mod):
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = rand(rng, 2, 6, 16)
    y = apply_rotary(x, [0, 1, 2, 5, 17, 100])
    close(np.linalg.norm(y.numpy(), axis=-1), np.linalg.norm(x.numpy(), axis=-1),
          what=f"the norm of each rotated vector (a rotation keeps it) on x {x.shape}")
    assert not np.allclose(y.numpy()[:, 1:], x.numpy()[:, 1:]), "positions > 0 should rotate"


def rope_rotates_pairs(mod):
    """With D = 2 there is one pair and theta_0 = 1: (1, 0) at position m becomes (cos m, sin m)."""
    apply_rotary = need(mod, "apply_rotary")
    x = ta.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype="float64")   # (T=3, D=2)
    m = np.array([1.0, 2.0, 3.0])
    expected = np.stack([np.cos(m), np.sin(m)], -1)                  # rows 0 and 1: (cos m, sin m)
    expected[2] = [-np.sin(3.0), np.cos(3.0)]                        # (0, 1) turns the same way
    close(apply_rotary(x, [1, 2, 3]), expected, what=f"apply_rotary(x {x.shape}, positions [1, 2, 3]) against the pairwise rotation")


def rope_is_relative(mod):
    """q_m . k_n depends only on m - n."""
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    q, k = rand(rng, 1, 16), rand(rng, 1, 16)

    def score(m, n):
        return float((apply_rotary(q, [m]).numpy() * apply_rotary(k, [n]).numpy()).sum())
    same = [score(3, 1), score(10, 8), score(52, 50), score(2, 0)]
    compare(same, np.full(4, same[0]), "q_m . k_n for m - n = 2 at four positions", tol=1e-9)
    assert abs(score(5, 1) - same[0]) > 1e-6, "a different offset should give a different score"


def rope_rows_are_independent(mod):
    """Rotating T rows at once equals rotating each row at its own position."""
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = rand(rng, 2, 5, 8)
    positions = [4, 0, 9, 2, 7]
    y = apply_rotary(x, positions).numpy()
    for t, p in enumerate(positions):
        close(y[:, t:t + 1], apply_rotary(x[:, t:t + 1], [p]), what=f"row {t} rotated alone against rotated with the others")


def rope_gradcheck(mod):
    apply_rotary, rng = need(mod, "apply_rotary"), rng_()
    x = rand(rng, 2, 4, 8, grad=True)
    autodiff_gradcheck("the gradient of apply_rotary(x (2, 4, 8), positions [0, 1, 2, 3])",
                       lambda x: apply_rotary(x, [0, 1, 2, 3]), (x,), ("x",))


CHECKS = [rope_keeps_shape_and_dtype, rope_position_zero_is_identity, rope_preserves_norms, rope_rotates_pairs,
        rope_is_relative, rope_rows_are_independent, rope_gradcheck]
