"""--lora_rank R: fine-tune a trained model (--init_from) with low-rank adapters.

Your LoRALinear (exercise 17 of EXERCISES.md, exercises/lora.py) goes around the
attention projection (attn.c_attn) of every block, once its checks pass; every
other weight is frozen, so only the adapters train: R * (C + 3C) numbers a block.
A checkpoint holds the merged weights (W + alpha/R B A), under a plain GPT's
names, so python -m train.sample, train.explore, train.export_hf and a later
--init_from read it as any GPT; it keeps no adapters apart, so a LoRA run is not
continued with --resume, but started again from its checkpoint.
"""
from collections import OrderedDict


def lora_linear(package="exercises"):
    """Your LoRALinear class, once exercise 17 passes; else a ValueError in one line saying so."""
    from exercises.checking.common import load_exercise
    from exercises.checking.progress import BY_NAME, check
    result = check(BY_NAME["lora"], package)
    if not result.passing:
        raise ValueError(f"--lora_rank trains your LoRALinear (exercise 17 of EXERCISES.md, exercises/lora.py), "
                         f"which is {result.status}: {result.reason} (see python -m exercises lora)")
    return load_exercise("lora", package).LoRALinear


def adapt(model, lora_class, rank, alpha):
    """Freeze every parameter of ``model`` and put a LoRALinear(rank, alpha) around each block's
    attn.c_attn. -> the number of trainable (adapter) parameters."""
    for p in model.parameters():
        p.requires_grad = False
    for block in model.h:
        block.attn.c_attn = lora_class(block.attn.c_attn, rank, alpha)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def merged_state(model):
    """The model's state with every adapted layer merged: a plain GPT's names and shapes."""
    adapted = {name: m for name, m in model.named_modules() if hasattr(m, "merge") and hasattr(m, "base")}
    state = OrderedDict()
    for name, t in model.state_dict().items():
        owner = next((prefix for prefix in adapted if name.startswith(prefix + ".")), None)
        if owner is None:
            state[name] = t
        elif owner not in {k.rpartition(".")[0] for k in state}:       # the merged layer, once
            for key, value in adapted[owner].merge().state_dict().items():
                state[f"{owner}.{key}"] = value
    return state
