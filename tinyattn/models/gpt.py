"""A decoder-only GPT in one readable file, shaped like nanoGPT's model.py.

B batch, T time (tokens), C channels (n_embd), H heads, V vocabulary.
"""
import math
from dataclasses import dataclass, asdict

from ..autograd import inference_mode
from ..tensor import arange, randn, tensor, zeros_like
from ..ops import cat
from ..backend import get_backend, host_rng
from .. import nn
from ..nn import functional as F
from . import hf


INITS = ("gpt2", "default")
POSITIONS = ("learned", "rope")             # GPT-2's learned position embeddings, or rotary (RoPE)
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "relu2")          # GPT-2's, Llama's gated one, nanochat's ReLU squared


@dataclass
class GPTConfig:
    """The defaults are GPT-2's block (nanoGPT's). The modern block (Llama, Mistral, Qwen, nanochat)
    differs in a few independent choices: pos="rope", norm="rmsnorm", mlp="swiglu" (or "relu2"),
    n_kv_head < n_head, qk_norm=True, bias=False, tie_embeddings=False."""
    block_size: int = 256
    vocab_size: int = 65
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True          # biases in every Linear (and LayerNorm)
    gelu: str = "tanh"        # "tanh" (GPT-2's approximation) or "none" (exact erf)
    init: str = "gpt2"        # "gpt2" (nanoGPT's N(0, 0.02)) or "default" (each layer's own, as in PyTorch)
    head_dropout: float = 0.0  # while training, drop whole attention heads with this probability (DropHead)
    pos: str = "learned"       # "learned" (a table of block_size rows, wpe) or "rope" (rotary, in attention)
    rope_theta: float = 10000.0   # RoPE's base (Llama's rope_theta)
    norm: str = "layernorm"    # "layernorm" or "rmsnorm"
    norm_eps: float = 1e-5     # the eps of every norm
    mlp: str = "gelu"          # "gelu" (4C wide), "swiglu" (three matrices, 8C/3 wide: as many weights), "relu2"
    mlp_hidden: int = None     # the MLP's width; None: 4 n_embd (gelu, relu2), 8 n_embd // 3 (swiglu)
    n_kv_head: int = None      # key/value heads (grouped-query attention; 1: multi-query); None: n_head
    qk_norm: bool = False      # an RMSNorm on each head's queries and keys
    tie_embeddings: bool = True   # lm_head shares wte's weight (GPT-2), or has its own (Llama)

    def __post_init__(self):
        if self.init not in INITS:
            raise ValueError(f"GPTConfig: init must be one of {', '.join(map(repr, INITS))}, got {self.init!r}")
        for field, allowed in (("pos", POSITIONS), ("norm", NORMS), ("mlp", MLPS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"GPTConfig: {field} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {getattr(self, field)!r}")
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.n_kv_head < 1 or self.n_head % self.n_kv_head:
            raise ValueError(f"GPTConfig: n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head})")
        if self.pos == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"GPTConfig: pos='rope' needs an even head size, got n_embd / n_head = "
                             f"{self.n_embd} / {self.n_head}")
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            raise ValueError(f"GPTConfig: mlp_hidden must be at least 1, got {self.mlp_hidden}")

    @property
    def hidden(self):
        """The MLP's width: mlp_hidden, else 4 n_embd, or for SwiGLU 8 n_embd // 3 (rounded down), so
        that its three matrices hold about as many weights as GELU's two (3 * 8C/3 * C = 8 C^2)."""
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        return 8 * self.n_embd // 3 if self.mlp == "swiglu" else 4 * self.n_embd

    def to_dict(self):
        return asdict(self)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.hidden, bias=config.bias)
        self.gelu = nn.GELU(config.gelu)
        self.c_proj = nn.Linear(config.hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):                                          # (B, T, C)
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))  # through (B, T, 4C)


class ReLU2MLP(nn.Module):
    """nanochat's MLP: GELU's place taken by relu(x)^2 (Primer, So et al., 2021)."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):                                          # (B, T, C)
        h = F.relu(self.c_fc(x))                                   # (B, T, 4C)
        return self.dropout(self.c_proj(h * h))


class SwiGLU(nn.Module):
    """Llama's gated MLP (Shazeer, 2020): c_proj(silu(c_gate(x)) * c_fc(x)).

    transformers' LlamaMLP names them gate_proj (c_gate), up_proj (c_fc) and down_proj (c_proj).
    Three matrices of width 8C/3 hold as many weights as GELU's two of width 4C."""

    def __init__(self, config):
        super().__init__()
        self.c_gate = nn.Linear(config.n_embd, config.hidden, bias=config.bias)
        self.c_fc = nn.Linear(config.n_embd, config.hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):                                          # (B, T, C)
        h = F.silu(self.c_gate(x)) * self.c_fc(x)                  # (B, T, hidden): the gate times the value
        return self.dropout(self.c_proj(h))


def make_norm(config):
    """The block's norm over C channels: LayerNorm (with a bias where config.bias) or RMSNorm."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = nn.MultiHeadAttention(config.n_embd, config.n_head, bias=config.bias, dropout=config.dropout,
                                          head_dropout=config.head_dropout, n_kv_head=config.n_kv_head,
                                          rope_theta=config.rope_theta if config.pos == "rope" else None,
                                          qk_norm=config.qk_norm, norm_eps=config.norm_eps)
        self.ln_2 = make_norm(config)
        self.mlp = {"gelu": MLP, "swiglu": SwiGLU, "relu2": ReLU2MLP}[config.mlp](config)

    def forward(self, x, kv_cache=None):                           # (B, T, C)
        x = x + self.attn(self.ln_1(x), is_causal=kv_cache is None, kv_cache=kv_cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)  # token embeddings
        if config.pos == "learned":
            self.wpe = nn.Embedding(config.block_size, config.n_embd)  # position embeddings
        else:
            self.wpe = None                                        # rotary: the positions turn q and k instead
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = make_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight                  # tied: one parameter
        if config.init == "gpt2":
            self._init_weights()
        # "default": every layer keeps the initialization it made itself, as a GPT built from
        # PyTorch's modules would: Embedding N(0, 1), Linear and its bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))

    def _init_weights(self):
        """GPT-2 init: N(0, 0.02), zero biases, residual projections N(0, 0.02 / sqrt(2 n_layer))."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.data = zeros_like(p).data
            elif name.endswith("weight") and p.ndim == 2:
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj.weight") else 0.02
                p.data = (randn(*p.shape, dtype=p.dtype, device=p.device) * std).data

    def num_parameters(self, non_embedding=True):
        """Parameter count; by default without the position embeddings, as nanoGPT reports."""
        n = super().num_parameters()
        return n - self.wpe.weight.numel() if non_embedding and self.wpe is not None else n

    def forward(self, idx, targets=None, kv_caches=None):
        """idx (B, T) ints -> logits (B, T, V), and the mean cross-entropy when targets are given.

        With ``kv_caches`` (one KVCache per block) only the new tokens are run:
        their positions continue after the cached ones.
        """
        _check_model_input(idx, targets)
        B, T = idx.shape
        start = len(kv_caches[0]) if kv_caches else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} is longer than block_size {self.config.block_size}")
        if self.wpe is not None:
            pos = arange(start, start + T, device=idx.device)              # (T,)
            x = self.drop(self.wte(idx) + self.wpe(pos))                     # (B, T, C)
        else:                                                                # (rotary: in each attention)
            x = self.drop(self.wte(idx))
        for i, block in enumerate(self.h):
            x = block(x, kv_caches[i] if kv_caches else None)
        logits = self.lm_head(self.ln_f(x))                                  # (B, T, V)
        if targets is None:
            return logits, None
        # (targets may be a slice, idx[:, 1:], that no view can flatten: reshape copies it then)
        loss = F.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T), ignore_index=-1)
        return logits, loss

    def export_hf(self, folder, chars=None, tokenizer=None):
        """Write the model as Hugging Face's GPT-2 (config.json, model.safetensors) into ``folder``:
        ``transformers.GPT2LMHeadModel.from_pretrained(folder)`` loads it. A model with Llama's
        choices (pos="rope", norm="rmsnorm", mlp="swiglu", no qk_norm) is written as a
        ``LlamaForCausalLM`` instead (models/llama.py); other mixes are refused, naming the choice.
        ``chars``, a character vocabulary (token id -> character), or ``tokenizer``, a BPE, goes
        into tokenizer.json. See models/hf.py."""
        hf.export_hf(self, folder, chars, tokenizer)

    @classmethod
    def from_hf(cls, folder, **overrides):
        """A GPT from a Hugging Face GPT-2 or Llama folder (gpt2, distilgpt2, a small Llama, one
        written by export_hf); an architecture this GPT cannot represent is a ValueError naming
        the config field.
        ``overrides``: dropout, head_dropout (for fine-tuning)."""
        return hf.from_hf(cls, folder, **overrides)

    def configure_optimizer(self, weight_decay, learning_rate, betas, fused=False):
        """AdamW over the parameters that train (requires_grad), decaying matrices (ndim >= 2)
        only: not biases or LayerNorm weights. fused: AdamW's step on flat buffers (the same
        arithmetic; see AdamW), which a model made by ta.compile asks for."""
        from ..optim import AdamW
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        return AdamW([{"params": decay, "weight_decay": weight_decay},
                      {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=betas, fused=fused)

    @inference_mode()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, use_cache=True, stop=None):
        """Sample ``max_new_tokens`` tokens after ``idx`` (B, T) and return (B, T + new).

        ``stop``, a list of token ids, ends the sampling early once every row has
        produced that sequence (a row that finished first keeps going: cut it there).

        With the KV cache each new token costs one position, not a full
        forward. Once the text is longer than block_size the window slides:
        every position changes, so the cache is rebuilt from the cropped context.
        Randomness comes from the host generator (``ta.manual_seed``).
        """
        _check_model_input(idx, None)
        if not 0 <= temperature < math.inf or (top_k is not None and top_k < 1) or \
                (top_p is not None and not 0 < top_p <= 1):                       # (NaN fails too)
            raise ValueError(f"generate: need temperature >= 0, top_k >= 1 and top_p in (0, 1]; got temperature "
                             f"{temperature}, top_k {top_k}, top_p {top_p}")
        was_training = self.training
        self.eval()
        block = self.config.block_size
        caches = None
        recent = [[] for _ in range(idx.shape[0])] if stop else None   # each row's newest tokens, on the host
        finished = [False] * idx.shape[0]
        for _ in range(max_new_tokens):
            if use_cache and caches is not None and idx.shape[1] <= block:
                logits, _ = self(idx[:, -1:], kv_caches=caches)       # the newest token only
            else:
                context = idx[:, -block:]
                caches = [nn.KVCache() for _ in self.h] if use_cache and idx.shape[1] < block else None
                logits, _ = self(context, kv_caches=caches)
            next_id = sample_next(logits[:, -1, :], temperature, top_k, top_p)   # (B, 1)
            idx = cat([idx, tensor(next_id, device=idx.device)], dim=1)
            if stop:
                for row, token in enumerate(next_id[:, 0].tolist()):
                    recent[row] = (recent[row] + [token])[-len(stop):]
                    finished[row] = finished[row] or recent[row] == list(stop)
                if all(finished):
                    break
        self.train(was_training)
        return idx


def _check_model_input(idx, targets):
    """idx: a (B, T) Tensor of integer ids; targets, if any, the same shape."""
    F.check_ids("GPT", "idx", idx)
    if idx.ndim != 2:
        raise ValueError(f"GPT expects idx (B, T) of token ids, got shape {idx.shape} "
                         "(one sequence? add a batch dim: idx[None])")
    if targets is not None:
        F.check_ids("GPT", "targets", targets)
        if targets.shape != idx.shape:
            raise ValueError(f"GPT: targets shape {targets.shape} does not match idx shape {idx.shape}")


def sample_next(logits, temperature=1.0, top_k=None, top_p=None):
    """One token id per row of (B, V) logits, on the host: (B, 1) int64.

    temperature 0 is greedy. top_k keeps the k largest logits; top_p keeps the
    smallest set of tokens whose probability adds up to at least p.
    """
    np = get_backend("cpu").xp
    logits = logits.numpy().astype(np.float64)                            # (B, V)
    if temperature == 0:
        return logits.argmax(-1)[:, None]
    logits = logits / temperature
    if top_k is not None:
        kth = np.sort(logits, axis=-1)[:, -min(top_k, logits.shape[-1])][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if top_p is not None:
        order = np.argsort(-probs, axis=-1)
        sorted_p = np.take_along_axis(probs, order, -1)
        before = np.cumsum(sorted_p, -1) - sorted_p                       # mass of the better tokens
        keep_sorted = before < top_p                                      # the best token always stays
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(-1, keepdims=True)
    rng = host_rng()
    u = rng.random((probs.shape[0], 1))
    return np.minimum((np.cumsum(probs, -1) < u).sum(-1, keepdims=True), probs.shape[1] - 1)
