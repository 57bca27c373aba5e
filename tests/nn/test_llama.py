"""The modern block as Hugging Face's Llama: export_hf writes a LlamaForCausalLM folder, from_hf reads one
(also one that transformers wrote), against transformers' own logits and greedy tokens."""
import json

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LLAMA = dict(pos="rope", norm="rmsnorm", mlp="swiglu", bias=False)
CASES = {
    "gqa, untied": dict(n_kv_head=2, tie_embeddings=False),
    "multi-head, tied": dict(),
    "multi-query, biases, theta 500, eps 1e-6": dict(n_kv_head=1, bias=True, rope_theta=500.0, norm_eps=1e-6),
}


def modern(**kw):
    """A small Llama-shaped GPT with weights moved off their init (so logits differ clearly)."""
    ta.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(block_size=64, vocab_size=13, n_layer=2, n_head=4, n_embd=16), **LLAMA, **kw}))
    rng = np.random.default_rng(1)
    for p in model.parameters():
        p.data = p.data + rng.normal(0, 0.3, p.shape).astype(np.float32)
    return model.eval()


def logits_of(hf_model, idx):
    with torch.no_grad():
        return hf_model(torch.tensor(idx)).logits.numpy()


def greedy_of(hf_model, prompt, n):
    with torch.no_grad():
        ids = torch.tensor(prompt)                                # (every token counts: none is padding)
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                pad_token_id=0)
    assert out.shape[1] == prompt.shape[1] + n                   # (no end token stopped it)
    return out.numpy()


IDX = np.random.default_rng(2).integers(0, 13, (2, 14))


@pytest.mark.parametrize("name", CASES)
def test_an_exported_model_is_transformers_llama(name, tmp_path):
    model = modern(**CASES[name])
    model.export_hf(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == model.config.n_kv_head
    hf_model = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    assert sum(p.numel() for p in hf_model.parameters()) == model.num_parameters()
    np.testing.assert_allclose(model(ta.tensor(IDX))[0].numpy(), logits_of(hf_model, IDX), rtol=0, atol=1e-5)
    prompt = IDX[:1, :4]
    ours = model.generate(ta.tensor(prompt), 50, temperature=0).numpy()
    np.testing.assert_array_equal(ours, greedy_of(hf_model, prompt, 50))


@pytest.mark.parametrize("name", CASES)
def test_from_hf_reads_back_what_export_hf_wrote(name, tmp_path):
    model = modern(**CASES[name])
    model.export_hf(str(tmp_path))
    again = GPT.from_hf(str(tmp_path))
    assert again.config == model.config
    np.testing.assert_array_equal(again(ta.tensor(IDX))[0].numpy(), model(ta.tensor(IDX))[0].numpy())


@pytest.mark.parametrize("kw", [dict(num_key_value_heads=2, tie_word_embeddings=False),
                                dict(num_key_value_heads=4, tie_word_embeddings=True, rope_theta=1000.0),
                                dict(num_key_value_heads=1, attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5)])
def test_a_folder_written_by_transformers_loads_with_the_same_logits(kw, tmp_path):
    """A randomly initialised small LlamaForCausalLM, saved with save_pretrained (its own width, 40)."""
    torch.manual_seed(0)
    rope = kw.pop("rope_theta", None)
    config = transformers.LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
                                      num_attention_heads=4, max_position_embeddings=64, initializer_range=0.3,
                                      bos_token_id=None, eos_token_id=None,
                                      **kw, **({"rope_parameters": {"rope_type": "default", "rope_theta": rope}}
                                               if rope else {}))
    hf_model = transformers.LlamaForCausalLM(config).float().eval()
    if config.attention_bias:
        with torch.no_grad():
            for name, p in hf_model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.3)
    hf_model.save_pretrained(str(tmp_path))
    model = GPT.from_hf(str(tmp_path))
    assert model.config.mlp_hidden == 40 and model.config.n_kv_head == config.num_key_value_heads
    assert model.config.rope_theta == (rope or 10000.0) and model.config.norm_eps == config.rms_norm_eps
    np.testing.assert_allclose(model(ta.tensor(IDX))[0].numpy(), logits_of(hf_model, IDX), rtol=0, atol=1e-5)
    prompt = IDX[1:, :3]
    np.testing.assert_array_equal(model.generate(ta.tensor(prompt), 50, temperature=0).numpy(),
                                  greedy_of(hf_model, prompt, 50))


@pytest.mark.parametrize("kw, named", [
    (dict(qk_norm=True), "qk_norm is True (Llama's is False)"),
    (dict(norm="layernorm"), "norm is 'layernorm' (Llama's is 'rmsnorm')"),
    (dict(mlp="relu2"), "mlp is 'relu2' (Llama's is 'swiglu')"),
    (dict(pos="learned", n_kv_head=2), "pos is 'learned' (Llama's is 'rope')"),
])
def test_a_choice_llama_cannot_express_is_refused_in_one_line(kw, named, tmp_path):
    with pytest.raises(ValueError) as e:
        modern(**kw).export_hf(str(tmp_path))
    assert named in str(e.value) and "\n" not in str(e.value) and "cannot write this model as GPT-2 or as Llama" in str(e.value)
    assert not (tmp_path / "config.json").exists()


def test_gpt2s_choices_still_travel_as_gpt2(tmp_path):
    ta.manual_seed(0)
    GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)).export_hf(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt2"


@pytest.mark.parametrize("change, named", [
    (dict(hidden_act="gelu"), "hidden_act is 'gelu'"),
    (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_parameters=None), "rope_scaling is"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5}), "rope_parameters is"),
    (dict(num_key_value_heads=3), "num_key_value_heads is 3"),
    (dict(head_dim=8), "head_dim is 8"),
    (dict(mlp_bias=True), "mlp_bias is True"),
])
def test_a_llama_folder_tinyattn_cannot_represent_is_refused_naming_the_field(change, named, tmp_path):
    modern().export_hf(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError) as e:
        GPT.from_hf(str(tmp_path))
    assert named in str(e.value) and "cannot load" in str(e.value) and "\n" not in str(e.value)
