"""python -m train with the modern block's flags (--pos --norm --mlp --n_kv_head --qk_norm --tie_embeddings):
the checkpoint keeps them, and --resume, sampling, --init_from, LoRA and safetensors work with them."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tinyattn as ta
from tinyattn.models import GPT, GPTConfig
from train import checkpoint
from train.command import main
from train.config import parse_args
from train.sample import load_model, main as sample_main

from training_data import REPO, TEXT, TINY

MODERN = ["--pos", "rope", "--norm", "rmsnorm", "--mlp", "swiglu", "--n_kv_head", "1", "--qk_norm", "true",
          "--bias", "false", "--tie_embeddings", "false"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "tiny.txt"
    path.write_text(TEXT)
    return str(path)


@pytest.fixture(scope="module")
def trained(text_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("modern")
    assert main(["--data", text_file, "--out_dir", str(out), *TINY, *MODERN, "--max_iters", "6",
                 "--eval_interval", "3"]) == 0
    return out


def test_the_checkpoint_keeps_the_choices_and_loads_as_that_model(trained):
    meta = checkpoint.read_meta(str(trained / "ckpt.npz"))
    config = meta["config"]
    assert (config["pos"], config["norm"], config["mlp"], config["n_kv_head"], config["qk_norm"], config["bias"],
            config["tie_embeddings"]) == ("rope", "rmsnorm", "swiglu", 1, True, False, False)
    model, _ = load_model(str(trained))
    assert model.wpe is None and model.h[0].attn.n_kv_head == 1 and "lm_head.weight" in model.state_dict()


def test_resume_continues_exactly_as_one_run(text_file, trained, tmp_path):
    """Six steps in one run, against three, then --resume to six: the same weights."""
    half = tmp_path / "half"
    assert main(["--data", text_file, "--out_dir", str(half), *TINY, *MODERN, "--max_iters", "3",
                 "--eval_interval", "3"]) == 0
    assert main(["--data", text_file, "--out_dir", str(half), "--resume", "--max_iters", "6", "--quiet"]) == 0
    whole, _, _ = checkpoint.load(str(trained / "ckpt.npz"))
    resumed, _, _ = checkpoint.load(str(half / "ckpt.npz"))
    assert set(whole) == set(resumed)
    for name in whole:
        np.testing.assert_array_equal(whole[name], resumed[name], err_msg=name)


def test_resume_refuses_another_choice_in_one_line(text_file, trained, capsys):
    assert main(["--data", text_file, "--out_dir", str(trained), "--resume", "--mlp", "gelu", "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--mlp gelu (the checkpoint has swiglu)" in err


@pytest.mark.parametrize("argv, said", [
    (["--n_head", "4", "--n_kv_head", "3"], "--n_kv_head 3 must divide --n_head 4"),
    (["--n_head", "4", "--n_embd", "12", "--pos", "rope"], "--pos rope needs an even head size"),
    (["--mlp", "geglu"], "argument --mlp: invalid choice: 'geglu'"),
    (["--qk_norm", "maybe"], "argument --qk_norm"),
])
def test_a_bad_choice_is_refused_in_one_line(capsys, argv, said):
    with pytest.raises(SystemExit) as e:
        parse_args(["--max_iters", "1", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and said in err[0], err


def test_the_defaults_stay_gpt2s():
    args, _ = parse_args(["--max_iters", "1"])
    assert (args.pos, args.norm, args.mlp, args.n_kv_head, args.qk_norm, args.tie_embeddings, args.rope_theta) == \
        ("learned", "layernorm", "gelu", None, False, True, 10000.0)


def test_sampling_with_and_without_compile_gives_the_same_text(trained, capsys):
    outs = []
    for compiled in ("True", "False"):
        assert sample_main(["--out_dir", str(trained), "--num_samples", "1", "--max_new_tokens", "30",
                            "--temperature", "0", "--compile", compiled]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and len(outs[0]) > 30


def test_init_from_and_lora_keep_the_choices(text_file, trained, tmp_path, monkeypatch, capsys):
    """LoRA goes around attn.c_attn, whose output is (n_head + 2 n_kv_head) head sizes wide with GQA."""
    from exercise_solutions import lora as solution
    from train import lora
    monkeypatch.setattr(lora, "lora_linear", lambda: solution.LoRALinear)
    out = tmp_path / "lora"
    assert main(["--data", text_file, "--out_dir", str(out), "--init_from", str(trained), *TINY, "--max_iters", "3",
                 "--eval_interval", "3", "--lora_rank", "2"]) == 0
    assert "--lora_rank 2: 96 adapter parameters train" in capsys.readouterr().err    # 2 * (16 + (2 + 2) * 8)
    before, _, _ = checkpoint.load(str(trained / "ckpt.npz"))
    after, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    assert meta["config"]["pos"] == "rope" and set(after) == set(before)
    assert sorted(k for k in before if not np.array_equal(before[k], after[k])) == ["h.0.attn.c_attn.weight"]
    assert main(["--data", text_file, "--out_dir", str(tmp_path / "x"), "--init_from", str(trained), *TINY,
                 "--max_iters", "1", "--pos", "learned"]) == 1
    assert "--pos learned (the model has rope)" in capsys.readouterr().err


def test_safetensors_round_trip_of_a_modern_model(trained, tmp_path):
    model, _ = load_model(str(trained))
    path = str(tmp_path / "model.safetensors")
    ta.save_safetensors(model.state_dict(), path)
    again = GPT(model.config)
    again.load_state_dict(ta.load_safetensors(path))
    idx = ta.tensor([[1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(again(idx)[0].numpy(), model(idx)[0].numpy())


def test_the_llama_preset_runs_as_written(tmp_path):
    folder = tmp_path / "data" / "shakespeare_char"
    folder.mkdir(parents=True)
    (folder / "input.txt").write_text(TEXT)
    proc = subprocess.run([sys.executable, "-m", "train", os.path.join(REPO, "config", "llama_shakespeare.py"),
                           *TINY, "--n_head", "4", "--max_iters", "2", "--eval_interval", "2"], cwd=tmp_path,
                          capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out-llama-shakespeare"
    assert json.loads((out / "summary.json").read_text())["iters"] == 2
    config = checkpoint.read_meta(str(out / "ckpt.npz"))["config"]
    assert (config["pos"], config["norm"], config["mlp"], config["n_kv_head"], config["bias"],
            config["tie_embeddings"], config["qk_norm"]) == ("rope", "rmsnorm", "swiglu", 2, False, False, False)
    from train.export_hf import main as export_main
    folder = tmp_path / "llama"
    assert export_main(["--out_dir", str(out), "--to", str(folder)]) == 0
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    tuned = tmp_path / "tuned"                       # and --init_from reads it back, with its characters
    assert main(["--data", str(tmp_path / "data" / "shakespeare_char" / "input.txt"), "--out_dir", str(tuned),
                 "--init_from", str(folder), *TINY, "--n_head", "4", "--max_iters", "2", "--eval_interval", "2"]) == 0
    config = checkpoint.read_meta(str(tuned / "ckpt.npz"))["config"]
    assert (config["n_head"], config["n_kv_head"], config["tie_embeddings"]) == (4, 2, False)


def test_export_refuses_a_choice_llama_cannot_express_in_one_line(trained, tmp_path, capsys):
    from train.export_hf import main as export_main
    assert export_main(["--out_dir", str(trained), "--to", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "qk_norm is True (Llama's is False)" in err


def test_the_explorer_draws_attention_per_query_head(trained, tmp_path, capsys):
    """With GQA (n_kv_head 1 of n_head 2) the page still shows each query head's weights."""
    from train.explore import main as explore_main
    page = tmp_path / "attention.html"
    assert explore_main(["--out_dir", str(trained), "--text", "First Citizen:", "--out", str(page)]) == 0
    assert "1 layers x 2 heads" in capsys.readouterr().out and page.stat().st_size > 1000


def test_sft_grows_an_untied_head_with_the_chat_tokens(text_file, tmp_path):
    """Fine-tuning on conversations adds the chat tokens: the new rows of wte and of an untied
    lm_head both start at the mean of the model's rows."""
    from data.prepare import main as prepare_main
    from data.tasks import make_task
    trained = tmp_path / "base"
    assert main(["--data", text_file, "--out_dir", str(trained), *TINY, *MODERN, "--block_size", "48",
                 "--max_iters", "2", "--eval_interval", "2"]) == 0
    convs = make_task("spell", TEXT).conversations("train", 20)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
    folder = tmp_path / "conv"
    assert prepare_main([str(tmp_path / "train.jsonl"), "--tokenizer_from", str(trained), "--out_dir", str(folder)]) == 0
    out = tmp_path / "sft"
    assert main(["--data", str(folder), "--out_dir", str(out), "--init_from", str(trained), *TINY, "--block_size", "48",
                 "--max_iters", "0"]) == 0
    before, _, _ = checkpoint.load(str(trained / "ckpt.npz"))
    after, _, meta = checkpoint.load(str(out / "ckpt.npz"))
    old = before["lm_head.weight"].shape[0]
    assert after["lm_head.weight"].shape[0] == after["wte.weight"].shape[0] == meta["config"]["vocab_size"] > old
    for name in ("wte.weight", "lm_head.weight"):
        np.testing.assert_array_equal(after[name][:old], before[name])
        np.testing.assert_allclose(after[name][old:], np.repeat(before[name].mean(0, keepdims=True),
                                                                len(after[name]) - old, 0), rtol=1e-6)


@pytest.fixture(scope="module")
def modern_chat_model(tmp_path_factory):
    """A tiny chat model (random weights) with every modern choice, saved as --init_from reads it,
    with preference pairs and a text for RL's words."""
    from data.chat import CHAT_TOKENS
    from data.pairs import write_pairs
    from tinyattn.tokenizers import CharTokenizer
    from train.data import tokenizer_to_json
    folder = tmp_path_factory.mktemp("modern-chat")
    text = TEXT.lower()
    tok = CharTokenizer.from_text(text).extended(chars="abcdefghijklmnopqrstuvwxyz: 0123456789+?",
                                                 special_tokens=CHAT_TOKENS)
    ta.manual_seed(0)
    config = GPTConfig(block_size=48, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, pos="rope",
                       norm="rmsnorm", mlp="swiglu", n_kv_head=1, qk_norm=True, bias=False, tie_embeddings=False)
    model = GPT(config)
    optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.99))
    checkpoint.save(str(folder / "ckpt.npz"), model, optimizer,
                    dict(config=config.to_dict(), tokenizer=tokenizer_to_json(tok), step=0, log=[]))
    write_pairs(folder / "pairs", text, ["spell", "reverse"], 40, 10)
    (folder / "words.txt").write_text(text)
    return folder


def test_dpo_and_rl_fine_tune_a_modern_model(modern_chat_model, tmp_path):
    """The stages use only the GPT's interface: DPO learns the preference, RL runs its steps, and
    both leave a checkpoint with the model's choices."""
    ckpt = str(modern_chat_model / "ckpt.npz")
    assert main(["--stage", "dpo", "--init_from", ckpt, "--data", str(modern_chat_model / "pairs"),
                 "--out_dir", str(tmp_path / "dpo"), "--batch_size", "8", "--eval_iters", "2",
                 "--eval_interval", "10", "--learning_rate", "1e-2", "--warmup_iters", "2", "--max_iters", "40",
                 "--quiet"]) == 0
    summary = json.loads((tmp_path / "dpo" / "summary.json").read_text())
    assert summary["val_reward_accuracy"] > 0.6                        # from 0 at the reference
    assert main(["--stage", "rl", "--init_from", ckpt, "--data", str(modern_chat_model / "words.txt"),
                 "--out_dir", str(tmp_path / "rl"), "--rl_prompts", "4", "--rl_samples", "4", "--rl_max_tokens", "4",
                 "--rl_eval_prompts", "6", "--eval_interval", "3", "--learning_rate", "3e-3", "--warmup_iters", "1",
                 "--max_iters", "3", "--rl_kl", "0.1", "--quiet"]) == 0
    for run in ("dpo", "rl"):
        model, _, meta = checkpoint.load(str(tmp_path / run / "ckpt.npz"))
        assert {k: meta["config"][k] for k in ("pos", "norm", "mlp", "n_kv_head", "qk_norm", "tie_embeddings")} == \
            dict(pos="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=1, qk_norm=True, tie_embeddings=False)


def test_a_llama_chat_model_exports_with_its_chat_template(modern_chat_model, tmp_path):
    """A chat model with Llama's choices travels as a LlamaForCausalLM folder with the chat format
    (issue 45's template, end token and generation config), read by transformers' tokenizer."""
    transformers = pytest.importorskip("transformers")
    from data.chat import render_prompt
    from train.export_hf import main as export_main
    model, _, meta = checkpoint.load(str(modern_chat_model / "ckpt.npz"))
    config = {**meta["config"], "qk_norm": False}                      # Llama has no QK-norm
    gpt = GPT(GPTConfig(**config))
    run = tmp_path / "run"
    run.mkdir()
    checkpoint.save(str(run / "ckpt.npz"), gpt, gpt.configure_optimizer(0.1, 1e-3, (0.9, 0.99)),
                    {**meta, "config": config})
    assert export_main(["--out_dir", str(run), "--to", str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    _, tok = load_model(str(run), "cpu")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    messages = [{"role": "user", "content": "spell cat"}]
    assert list(hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"]) == render_prompt(tok, messages)
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tok.special_tokens["<|end|>"]
