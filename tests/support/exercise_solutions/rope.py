"""Reference solution: rotary position embeddings (exercise 2 of EXERCISES.md)."""
import numpy as np

import tinyattn as ta


def rotary_tables(positions, dim, base=10000.0):
    """cos and sin of the angles m * theta_i: two (T, dim // 2) numpy arrays."""
    if isinstance(positions, ta.Tensor):
        positions = positions.numpy()
    pos = np.asarray(positions, dtype=np.float64)                    # (T,)
    theta = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)  # (dim/2,)  theta_0 = 1
    angles = pos[:, None] * theta[None, :]                           # (T, dim/2)
    return np.cos(angles), np.sin(angles)


def apply_rotary(x, positions, base=10000.0):
    """Rotate each pair (x[2i], x[2i+1]) of x (..., T, D) by the angle positions[t] * theta_i."""
    *lead, T, D = x.shape
    if D % 2:
        raise ValueError(f"apply_rotary: the last dim must be even, got {D}")
    cos, sin = rotary_tables(positions, D, base)
    cos = ta.tensor(cos, dtype=x.dtype, device=x.device)             # (T, D/2), a constant
    sin = ta.tensor(sin, dtype=x.dtype, device=x.device)
    pairs = x.reshape(*lead, T, D // 2, 2)                           # (..., T, D/2, 2)
    a, b = pairs[..., 0], pairs[..., 1]                              # (..., T, D/2) each
    rotated = ta.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)   # (..., T, D/2, 2)
    return rotated.reshape(x.shape)
