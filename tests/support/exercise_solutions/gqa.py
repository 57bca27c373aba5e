"""Reference solution: grouped-query attention (exercise 3 of EXERCISES.md)."""
import tinyattn.nn as nn
import tinyattn.nn.functional as F


def grouped_query_attention(q, k, v, is_causal=False):
    """q (B, H, T, D); k, v (B, G, T, D) with H divisible by G -> (B, H, T, D).

    Query head h uses key/value group h // (H // G): consecutive heads share one.
    """
    B, H, T, D = q.shape
    G = k.shape[1]
    if H % G:
        raise ValueError(f"grouped_query_attention: {H} query heads do not split into {G} groups")
    r = H // G                                                       # query heads per group
    Tk, Dv = k.shape[2], v.shape[3]
    k = k.unsqueeze(2).expand(B, G, r, Tk, D).reshape(B, H, Tk, D)   # each group repeated r times
    v = v.unsqueeze(2).expand(B, G, r, Tk, Dv).reshape(B, H, Tk, Dv)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


class GroupedQueryAttention(nn.Module):
    """Self-attention with n_head query heads sharing n_kv_head key/value heads."""

    def __init__(self, n_embd, n_head, n_kv_head, bias=True):
        super().__init__()
        if n_embd % n_head or n_head % n_kv_head:
            raise ValueError("n_embd must be divisible by n_head, and n_head by n_kv_head")
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, n_embd // n_head
        self.q_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.kv_proj = nn.Linear(n_embd, 2 * n_kv_head * self.head_dim, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x, is_causal=True):                            # (B, T, C) -> (B, T, C)
        B, T, C = x.shape
        H, G, D = self.n_head, self.n_kv_head, self.head_dim
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)          # (B, H, T, D)
        k, v = self.kv_proj(x).split(G * D, dim=2)                   # 2 x (B, T, G*D)
        k = k.view(B, T, G, D).transpose(1, 2)                       # (B, G, T, D)
        v = v.view(B, T, G, D).transpose(1, 2)
        y = grouped_query_attention(q, k, v, is_causal=is_causal)    # (B, H, T, D)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))
