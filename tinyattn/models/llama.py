"""The modern block in and out of Hugging Face's Llama format (LlamaForCausalLM).

A GPT whose choices are Llama's (pos="rope", norm="rmsnorm", mlp="swiglu"; any n_kv_head,
tied or untied embeddings, biases or none) is a Llama, with other names:

    tinyattn                          transformers (LlamaForCausalLM)
    wte.weight                        model.embed_tokens.weight
    h.0.ln_1.weight                   model.layers.0.input_layernorm.weight
    h.0.attn.c_attn.weight            model.layers.0.self_attn.q_proj, k_proj and v_proj .weight, one under another
    h.0.attn.c_proj.weight            model.layers.0.self_attn.o_proj.weight
    h.0.ln_2.weight                   model.layers.0.post_attention_layernorm.weight
    h.0.mlp.c_gate.weight             model.layers.0.mlp.gate_proj.weight
    h.0.mlp.c_fc.weight               model.layers.0.mlp.up_proj.weight
    h.0.mlp.c_proj.weight             model.layers.0.mlp.down_proj.weight
    ln_f.weight                       model.norm.weight
    lm_head.weight (untied)           lm_head.weight

Both store a Linear's weight as (out, in), so nothing is transposed. The rotary embedding is
the same rotation (pairs of channels i and i + D/2, "rotate_half"), with rope_theta its base,
and RMSNorm the same formula with rms_norm_eps; a head's queries are the same D channels of
q_proj's output. What Llama cannot express (a position table, LayerNorm, another MLP, QK-norm)
is refused in one line naming it.
"""
from ..backend import get_backend

np = get_backend("cpu").xp          # weights travel through host memory

LLAMA = "model."
CHOICES = dict(pos="rope", norm="rmsnorm", mlp="swiglu", qk_norm=False)   # what Llama's block is
GPT2 = dict(pos="learned", norm="layernorm", mlp="gelu", qk_norm=False, tie_embeddings=True)
LAYER = {"ln_1.weight": "input_layernorm.weight", "ln_2.weight": "post_attention_layernorm.weight",
         "attn.c_proj": "self_attn.o_proj", "mlp.c_gate": "mlp.gate_proj", "mlp.c_fc": "mlp.up_proj",
         "mlp.c_proj": "mlp.down_proj"}


def is_gpt2(config):
    """Whether the model's choices are GPT-2's (then it travels as GPT2LMHeadModel)."""
    return all(getattr(config, k) == v for k, v in GPT2.items()) and config.n_kv_head == config.n_head \
        and config.mlp_hidden in (None, 4 * config.n_embd)


def llama_refuses(config):
    """The first choice of ``config`` that Llama cannot express, as words ("mlp is 'gelu'"), or None."""
    for field, value in CHOICES.items():
        if getattr(config, field) != value:
            return f"{field} is {getattr(config, field)!r} (Llama's is {value!r})"
    return None


def to_llama(model):
    """-> (tensors, config): the model's weights under Llama's names, float32, and its config.json."""
    config = model.config
    why = llama_refuses(config)
    if why is not None:
        raise ValueError(f"export_hf: cannot write this model as GPT-2 or as Llama: {why}")
    C, H, Hkv = config.n_embd, config.n_head, config.n_kv_head
    D = C // H
    state = {name: p.numpy().astype(np.float32) for name, p in model.state_dict().items()}
    tensors = {LLAMA + "embed_tokens.weight": state.pop("wte.weight"), LLAMA + "norm.weight": state.pop("ln_f.weight")}
    if "lm_head.weight" in state:
        tensors["lm_head.weight"] = state.pop("lm_head.weight")
    for name, a in state.items():                           # h.<i>.<layer>...
        _, i, rest = name.split(".", 2)
        prefix = f"{LLAMA}layers.{i}."
        if rest.startswith("attn.c_attn."):                 # q, k, v one under another: (C + 2 Hkv D, ...)
            kind = rest.rsplit(".", 1)[1]                   # weight or bias
            q, k, v = np.split(a, [C, C + Hkv * D])
            for proj, part in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
                tensors[f"{prefix}self_attn.{proj}.{kind}"] = np.ascontiguousarray(part)
            continue
        layer = next(k for k in LAYER if rest.startswith(k))
        tensors[prefix + LAYER[layer] + rest[len(layer):]] = a
    hf_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": C,
        "intermediate_size": config.hidden,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": H,
        "num_key_value_heads": Hkv,
        "head_dim": D,
        "hidden_act": "silu",
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,                    # (transformers before 5 reads this one,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},   # 5 and later this)
        "rope_scaling": None,
        "attention_bias": config.bias,
        "mlp_bias": config.bias,
        "attention_dropout": config.dropout,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
        "torch_dtype": "float32",
    }
    return tensors, hf_config


def config_from_llama(hf, where):
    """Llama's config.json (a dict) -> the keyword arguments of a GPTConfig, or a ValueError naming
    the first field that tinyattn's GPT cannot represent."""
    def refuse(field, why):
        raise ValueError(f"{where}: cannot load: {field} is {hf.get(field)!r}; {why}")

    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "max_position_embeddings"):
        if not isinstance(hf.get(field), int) or hf[field] < 1:
            refuse(field, "it must be a positive integer")
    C, H = hf["hidden_size"], hf["num_attention_heads"]
    Hkv = hf.get("num_key_value_heads") or H
    if C % H:
        refuse("num_attention_heads", f"hidden_size {C} must be divisible by it")
    if not isinstance(Hkv, int) or H % Hkv:
        refuse("num_key_value_heads", f"it must divide num_attention_heads {H}")
    if hf.get("head_dim") not in (None, C // H):
        refuse("head_dim", f"tinyattn's heads are hidden_size / num_attention_heads = {C // H} wide")
    if hf.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", "tinyattn's SwiGLU gates with silu")
    if (C // H) % 2:
        refuse("num_attention_heads", "the rotary embedding needs an even head size")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type", "default")) != "default":
        field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
        refuse(field, "tinyattn's rotary embedding has no scaling (rope_type 'default' only)")
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        refuse("rope_theta", "it must be a positive number")
    if bool(hf.get("attention_bias", False)) != bool(hf.get("mlp_bias", False)):
        refuse("mlp_bias", f"tinyattn's bias covers every Linear (attention_bias is {hf.get('attention_bias')!r})")
    if hf.get("pretraining_tp", 1) != 1:
        refuse("pretraining_tp", "tinyattn splits no matrix across devices (1 only)")
    drop = hf.get("attention_dropout", 0.0)
    if isinstance(drop, bool) or not isinstance(drop, (int, float)) or not 0 <= drop < 1:
        refuse("attention_dropout", "a dropout probability is a number in [0, 1)")
    eps = hf.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
        refuse("rms_norm_eps", "it must be a positive number")
    return dict(block_size=hf["max_position_embeddings"], vocab_size=hf["vocab_size"], n_layer=hf["num_hidden_layers"],
                n_head=H, n_embd=C, dropout=float(drop), bias=bool(hf.get("attention_bias", False)),
                pos="rope", rope_theta=float(theta), norm="rmsnorm", norm_eps=float(eps), mlp="swiglu",
                mlp_hidden=None if hf["intermediate_size"] == 8 * C // 3 else hf["intermediate_size"],
                n_kv_head=Hkv, qk_norm=False,
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)))


def from_llama_state(arrays, config, where):
    """Llama's tensors (name -> array) -> tinyattn's state dict for a GPT of ``config``, or a
    ValueError naming what is missing or left over."""
    layers = {v: k for k, v in LAYER.items()}
    state, left = {}, dict(arrays)
    head = left.pop("lm_head.weight", None)
    for name in list(left):
        if name.startswith(LLAMA):
            left[name[len(LLAMA):]] = left.pop(name)
    if "embed_tokens.weight" in left:
        state["wte.weight"] = left.pop("embed_tokens.weight")
    if "norm.weight" in left:
        state["ln_f.weight"] = left.pop("norm.weight")
    if not config.tie_embeddings and head is not None:
        state["lm_head.weight"] = head
    elif head is not None and not np.array_equal(head, state.get("wte.weight")):
        raise ValueError(f"{where}: cannot load: lm_head.weight differs from embed_tokens.weight, but "
                         "tie_word_embeddings is true")
    for i in range(config.n_layer):
        prefix = f"layers.{i}."
        for kind in ("weight", "bias"):
            parts = [left.pop(f"{prefix}self_attn.{p}.{kind}", None) for p in ("q_proj", "k_proj", "v_proj")]
            if all(p is not None for p in parts):
                state[f"h.{i}.attn.c_attn.{kind}"] = np.concatenate(parts)
        for name in [n for n in left if n.startswith(prefix)]:
            rest = name[len(prefix):]
            layer = next((k for k in layers if rest.startswith(k)), None)
            if layer is not None:
                state[f"h.{i}.{layers[layer]}{rest[len(layer):]}"] = left.pop(name)
    left = [n for n in left if not n.endswith("rotary_emb.inv_freq")]       # (older files keep this buffer)
    if left:
        raise ValueError(f"{where}: not Llama's weights for this config.json: unexpected "
                         f"{', '.join(sorted(left)[:3])}{' and more' if len(left) > 3 else ''}")
    return state
