"""GPT.export_hf and GPT.from_hf: Hugging Face's GPT-2 folders, both ways.

The round trip through the folder runs everywhere; the comparisons with
transformers' GPT2LMHeadModel skip without torch and transformers.
"""
import json

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig


def random_gpt(**kw):
    """A small GPT whose every parameter is random (biases and LayerNorm too, so a wrong map shows)."""
    ta.manual_seed(0)
    cfg = dict(block_size=40, vocab_size=53, n_layer=2, n_head=4, n_embd=32)
    cfg.update(kw)
    model = GPT(GPTConfig(**cfg))
    rng = np.random.default_rng(1)
    for name, p in model.named_parameters():
        scale = 0.1 if name.endswith("bias") or ".ln_" in name or name.startswith("ln_f") else 0.15
        base = 1.0 if name.endswith("weight") and p.ndim == 1 else 0.0
        p.data = ta.tensor(base + scale * rng.standard_normal(p.shape), dtype="float32").data
    return model.eval()


def random_ids(vocab, shape=(3, 17)):
    return np.random.default_rng(2).integers(0, vocab, shape)


def logits_of(model, ids):
    return model(ta.tensor(ids))[0].numpy()


@pytest.mark.parametrize("kw", [{}, {"bias": False}, {"gelu": "none"}])
def test_export_then_from_hf_is_the_same_model(tmp_path, kw):
    model = random_gpt(**kw)
    model.export_hf(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    back = GPT.from_hf(tmp_path).eval()
    assert back.config.bias and back.config.gelu == model.config.gelu
    ids = random_ids(53)
    assert np.array_equal(logits_of(back, ids), logits_of(model, ids))


def test_export_uses_gpt2_names_and_layout(tmp_path):
    model = random_gpt()
    model.export_hf(tmp_path)
    arrays, metadata = ta.read_safetensors(tmp_path / "model.safetensors")
    assert metadata == {"format": "pt"}                         # transformers refuses a file without it
    assert "lm_head.weight" not in arrays                       # tied: wte is the head
    c_fc = model.h[0].mlp.c_fc.weight.numpy()                   # (4C, C) here, (C, 4C) in GPT-2's Conv1D
    assert np.array_equal(arrays["transformer.h.0.mlp.c_fc.weight"], c_fc.T)
    assert np.array_equal(arrays["transformer.wte.weight"], model.wte.weight.numpy())
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["activation_function"] == "gelu_new" and config["n_positions"] == 40


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("field, value", [
    ("activation_function", "relu"), ("n_inner", 100), ("layer_norm_epsilon", 1e-6),
    ("tie_word_embeddings", False), ("scale_attn_by_inverse_layer_idx", True), ("reorder_and_upcast_attn", True),
    ("scale_attn_weights", False), ("model_type", "mistral"), ("attn_pdrop", 0.3), ("add_cross_attention", True),
    ("layer_norm_epsilon", "small"), ("resid_pdrop", None), ("n_layer", 0), ("n_head", 5),
])
def test_from_hf_refuses_what_gpt_cannot_represent(tmp_path, field, value):
    random_gpt().export_hf(tmp_path)
    edit_config(tmp_path, **{field: value})
    with pytest.raises(ValueError) as e:
        GPT.from_hf(tmp_path)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_from_hf_refuses_a_config_that_is_not_an_object(tmp_path):
    random_gpt().export_hf(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not an object"):
        GPT.from_hf(tmp_path)
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        GPT.from_hf(tmp_path)


def test_from_hf_accepts_old_gpt2_files(tmp_path):
    """Keys without "transformer.", the attention mask buffers, a stored copy of the tied head, n_inner 4C."""
    model = random_gpt()
    model.export_hf(tmp_path)
    arrays, _ = ta.read_safetensors(tmp_path / "model.safetensors")
    arrays = {k[len("transformer."):]: v for k, v in arrays.items()}
    arrays["h.0.attn.bias"] = np.tril(np.ones((1, 1, 40, 40), np.float32))
    arrays["h.1.attn.masked_bias"] = np.array(-1e4, np.float32)
    arrays["lm_head.weight"] = arrays["wte.weight"]
    ta.save_safetensors(arrays, tmp_path / "model.safetensors", metadata={"format": "pt"})
    edit_config(tmp_path, n_inner=128, activation_function="gelu_pytorch_tanh")
    ids = random_ids(53)
    assert np.array_equal(logits_of(GPT.from_hf(tmp_path).eval(), ids), logits_of(model, ids))


def test_from_hf_refuses_untied_head_and_wrong_weights(tmp_path):
    random_gpt().export_hf(tmp_path)
    arrays, _ = ta.read_safetensors(tmp_path / "model.safetensors")
    whole = dict(arrays)
    untied = dict(arrays, **{"lm_head.weight": arrays["transformer.wte.weight"] + 1})
    ta.save_safetensors(untied, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="untied head"):
        GPT.from_hf(tmp_path)
    del arrays["transformer.h.1.mlp.c_fc.bias"]
    ta.save_safetensors(arrays, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing h.1.mlp.c_fc.bias"):
        GPT.from_hf(tmp_path)
    ta.save_safetensors(whole, tmp_path / "model.safetensors", metadata={"format": "pt"})
    edit_config(tmp_path, n_embd=64)
    with pytest.raises(ValueError, match="config.json makes it"):
        GPT.from_hf(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        GPT.from_hf(tmp_path)


def test_from_hf_reads_sharded_folders(tmp_path):
    model = random_gpt()
    model.export_hf(tmp_path)
    arrays, _ = ta.read_safetensors(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(arrays)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        ta.save_safetensors({n: arrays[n] for n in part}, tmp_path / file, metadata={"format": "pt"})
    index = {"weight_map": {n: file for file, part in shards.items() for n in part}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    ids = random_ids(53)
    assert np.array_equal(logits_of(GPT.from_hf(tmp_path).eval(), ids), logits_of(model, ids))


# --- against transformers' own GPT-2 ------------------------------------------------
def hf_logits_and_greedy(hf_model, ids, n_new):
    torch = pytest.importorskip("torch")
    x = torch.tensor(ids)
    with torch.no_grad():
        logits = hf_model(x).logits.numpy()
        out = hf_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n_new, min_new_tokens=n_new,
                                do_sample=False, pad_token_id=0)
    return logits, out.numpy()


def compare_with_transformers(ours, theirs, vocab):
    ids = random_ids(vocab, (4, 19))
    their_logits, their_tokens = hf_logits_and_greedy(theirs, ids, 20)
    our_logits = logits_of(ours, ids)
    gap = float(np.abs(our_logits - their_logits).max())
    assert gap <= 1e-5, f"max abs logit difference {gap}"
    our_tokens = ours.generate(ta.tensor(ids), 20, temperature=0).numpy()
    assert their_tokens.shape == our_tokens.shape == (4, 39)
    assert np.array_equal(our_tokens, their_tokens)
    return gap


def test_exported_gpt_runs_the_same_in_transformers(tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = random_gpt()
    model.export_hf(tmp_path)
    theirs, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    gap = compare_with_transformers(model, theirs.eval(), 53)
    print(f"export_hf -> GPT2LMHeadModel: max abs logit difference {gap:.3g}")


def test_transformers_gpt2_runs_the_same_here(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=61, n_positions=48, n_embd=48, n_layer=3, n_head=3,
                                     bos_token_id=None, eos_token_id=None)
    theirs = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():                                   # every parameter random, biases and LayerNorms too
        for name, p in theirs.named_parameters():
            base = 1.0 if name.endswith("weight") and p.ndim == 1 else 0.0
            p.copy_(base + 0.1 * torch.randn_like(p) if p.ndim == 1 else 0.15 * torch.randn_like(p))
    theirs.save_pretrained(tmp_path)
    ours = GPT.from_hf(tmp_path).eval()
    gap = compare_with_transformers(ours, theirs.eval(), 61)
    print(f"GPT2LMHeadModel -> from_hf: max abs logit difference {gap:.3g}")


# --- the character vocabulary travels as tokenizer.json ----------------------------
CHARS = sorted(set("First Citizen:\nBefore we proceed any further, hear me speak.\tÉtoile 'ç' ?!-;")) + ["Q", "Z"]


def test_char_vocabulary_round_trip(tmp_path):
    from tinyattn.models.hf import read_chars
    model = random_gpt(vocab_size=len(CHARS))
    model.export_hf(tmp_path, chars=CHARS)
    assert read_chars(tmp_path) == CHARS
    assert read_chars(tmp_path / "nowhere") is None
    with pytest.raises(ValueError, match="2 characters for a vocabulary of"):
        model.export_hf(tmp_path, chars=["a", "b"])


def test_transformers_reads_the_char_vocabulary(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = random_gpt(vocab_size=len(CHARS))
    model.export_hf(tmp_path, chars=CHARS)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Before we proceed,\n\tÉtoile 'ç' speak!"
    ids = tok.encode(text)
    assert ids == [CHARS.index(c) for c in text]
    assert tok.decode(ids) == text


CHAT = ["<|user|>", "<|assistant|>", "<|end|>"]


def test_special_tokens_of_a_char_vocabulary_are_added_tokens(tmp_path):
    """A chat model's vocabulary: characters, then <|user|> and the others, one id each in
    transformers as in tinyattn, and read back as the same tokenizer."""
    from tinyattn.models.hf import read_tokenizer
    from tinyattn.tokenizers import CharTokenizer
    tok = CharTokenizer(CHARS).extended(special_tokens=CHAT)
    model = random_gpt(vocab_size=tok.vocab_size)
    model.export_hf(tmp_path, tokenizer=tok)
    assert read_tokenizer(tmp_path).to_dict() == tok.to_dict()
    model.export_hf(tmp_path / "chars", chars=tok.chars)               # the same from the list of tokens
    assert read_tokenizer(tmp_path / "chars").to_dict() == tok.to_dict()
    text = "<|user|>Before we speak?<|end|><|assistant|>"
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert theirs.encode(text) == tok.encode(text, allowed_special="all")
    assert theirs.decode(tok.encode(text, allowed_special="all")) == text


def test_an_old_char_export_with_chat_tokens_is_refused_in_one_line(tmp_path):
    """Written before special tokens were added tokens: <|user|> was a vocabulary entry only, which
    transformers never matched. Refused with what to do, not read half right."""
    import json
    from tinyattn.models.hf import read_tokenizer
    from tinyattn.tokenizers.hf import char_to_hf_json
    from tinyattn.tokenizers import CharTokenizer
    old = char_to_hf_json(CharTokenizer(CHARS).extended(special_tokens=CHAT))
    old["added_tokens"] = []
    (tmp_path / "tokenizer.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"'<\|user\|>' is longer than one character but not an added token "
                                         r"\(an export from an older tinyattn: export the checkpoint again\)"):
        read_tokenizer(tmp_path)


def test_from_hf_weights_are_row_major(tmp_path):
    """A transposed view copied as it is would be column-major: another BLAS path, other roundings."""
    random_gpt(n_embd=16, n_head=2).export_hf(tmp_path)
    for name, t in GPT.from_hf(tmp_path).state_dict().items():
        assert t.data.flags["C_CONTIGUOUS"], name


def test_an_unseen_character_reads_as_the_unknown_token(tmp_path):
    """tokenizers' WordLevel needs an unknown token: the space stands in for an unseen character."""
    transformers = pytest.importorskip("transformers")
    model = random_gpt(vocab_size=len(CHARS))
    model.export_hf(tmp_path, chars=CHARS)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert tok.encode("a\u65e5e") == [CHARS.index("a"), CHARS.index(" "), CHARS.index("e")]


def test_bpe_tokenizer_json_round_trip(tmp_path):
    """A BPE travels as Hugging Face's byte-level tokenizer.json, and comes back the same."""
    pytest.importorskip("regex")
    from tinyattn.tokenizers import BPE
    from tinyattn.tokenizers.hf import byte_chars, from_hf_json
    from train.finetune import hf_tokenizer
    tok = BPE.train("hear me speak, speak. \u00c9toile \u65e5\u672c\n" * 30, 300).with_special_tokens(["<|user|>"])
    model = random_gpt(vocab_size=tok.vocab_size)
    model.export_hf(tmp_path, tokenizer=tok)
    d = json.loads((tmp_path / "tokenizer.json").read_text())
    assert d["model"]["vocab"]["\u0120speak"] == tok.ranks[b" speak"]       # a space byte is drawn as U+0120
    assert len(set(byte_chars())) == 256
    assert from_hf_json(d).to_dict() == hf_tokenizer(tmp_path).to_dict() == tok.to_dict()
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    n = tok.vocab_size
    with pytest.raises(ValueError, match=f"has {n} ids, more than the model's {n - 1}"):
        random_gpt(vocab_size=n - 1).export_hf(tmp_path, tokenizer=tok)
