"""Draw the pictures of docs/graphs.md: python docs/make_graph_pictures.py (from the repository root)."""
import math
import os

import tinyattn as ta
import tinyattn.nn.functional as F
from tinyattn.models import GPT, GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))


def neuron():
    """tanh(x . w + b): one neuron with two inputs."""
    x = ta.tensor([1.0, -2.0], requires_grad=True)
    w = ta.tensor([0.5, 0.3], requires_grad=True)
    b = ta.tensor(0.1, requires_grad=True)
    y = ((x * w).sum() + b).tanh()
    return y, dict(x=x, w=w, b=b)


def attention_head(T=4, C=8, D=4):
    """One causal attention head on T tokens of C channels, written out op by op."""
    ta.manual_seed(0)
    x = ta.randn(T, C)                                          # (T, C): the tokens, no gradient
    w_q, w_k, w_v = (ta.randn(C, D, requires_grad=True) for _ in range(3))
    q, k, v = x @ w_q, x @ w_k, x @ w_v                         # (T, D) each
    scores = (q @ k.T) * (1.0 / math.sqrt(D))                   # (T, T)
    future = ta.tensor([[j > i for j in range(T)] for i in range(T)])
    weights = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)   # (T, T), rows sum to 1
    return weights @ v, dict(x=x, w_q=w_q, w_k=w_k, w_v=w_v, future=future)    # (T, D)


def gpt_loss():
    ta.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=10))
    idx = ta.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    return model(idx, idx)[1]


if __name__ == "__main__":
    y, params = neuron()
    ta.viz.graph(y, os.path.join(HERE, "graph_neuron.png"), params=params)
    out, params = attention_head()
    ta.viz.graph(out, os.path.join(HERE, "graph_head.png"), params=params)
    ta.viz.graph(gpt_loss(), os.path.join(HERE, "graph_gpt.png"), depth=1)
    print("wrote docs/graph_neuron.png, docs/graph_head.png, docs/graph_gpt.png")
