"""A fine-tuned chat model in transformers: python -m train.export_hf writes a character and a
BPE chat model as transformers expects a chat model (chat tokens as added tokens, a chat
template, <|end|> as eos and a generation config), and transformers then prompts and answers
as python -m train.chat does. The models are fine-tuned on conversations that begin with a
system message, so the template's system turn and train.chat's --system are checked too.
Skipped without transformers and torch."""
import json
import subprocess
import sys

import pytest

from data import chat as chat_format
from data.chat import END, SYSTEM, render, render_prompt
from data.prepare import main as prepare_main
from data.prepare import read_tokenizer
from data.tasks import make_task
from tinyattn.tokenizers import BPE, CharTokenizer
from tinyattn.tokenizers.hf import chat_template
from train.command import main as train_main
from train.export_hf import main as export_main
from train.finetune import hf_tokenizer
from train.sample import load_model

from training_data import TEXT

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SMALL = ["--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--block_size", "64", "--batch_size", "16",
         "--eval_iters", "2", "--warmup_iters", "5", "--lr_decay_iters", "150", "--learning_rate", "1e-2",
         "--quiet", "--sample_tokens", "0", "--max_iters", "150", "--eval_interval", "150"]
BRIEF = "Spell it, letter by letter."                  # the system message of every conversation


def with_system(conversation):
    return {**conversation, "messages": [{"role": "system", "content": BRIEF}, *conversation["messages"]]}


def write_conversations(folder):
    """Spelling conversations, each with the system message first, in train.jsonl and test.jsonl
    -> questions to ask (a system message and a user's, as python -m train.chat --system BRIEF
    sends them)."""
    spell = make_task("spell", TEXT)
    for split, n in (("train", 200), ("test", 10)):
        convs = [with_system(c) for c in spell.conversations(split, n)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
    return [with_system(c)["messages"][:-1] for c in spell.conversations("train", 6, seed=1)]  # (their characters)


@pytest.fixture(scope="module", params=["char", "bpe"])
def exported(request, tmp_path_factory):
    """A model fine-tuned (from scratch) on spelling conversations with a system message, with a
    character or a BPE tokenizer, and its export: (run folder, exported folder, the test questions)."""
    folder = tmp_path_factory.mktemp(request.param)
    questions = write_conversations(folder)
    flags = []
    if request.param == "bpe":
        (folder / "text.txt").write_text(TEXT)
        assert prepare_main([str(folder / "text.txt"), "--vocab_size", "300", "--out_dir", str(folder / "tokens")]) == 0
        flags = ["--tokenizer_from", str(folder / "tokens")]
    assert prepare_main([str(folder / "train.jsonl"), "--val", str(folder / "test.jsonl"), *flags,
                         "--out_dir", str(folder / "convs")]) == 0
    assert train_main(["--data", str(folder / "convs"), "--out_dir", str(folder / "run"), *SMALL]) == 0
    assert export_main(["--out_dir", str(folder / "run"), "--to", str(folder / "hf")]) == 0
    return folder / "run", folder / "hf", questions


def piped_answers(out_dir, questions):
    """python -m train.chat --temperature 0 --system BRIEF's answers, one line a question."""
    assert all(q[0] == {"role": "system", "content": BRIEF} for q in questions)
    done = subprocess.run([sys.executable, "-m", "train.chat", "--out_dir", str(out_dir), "--temperature", "0",
                           "--system", BRIEF],
                          input="".join(q[-1]["content"] + "\n" for q in questions), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


def test_the_exported_tokenizer_is_a_chat_tokenizer(exported):
    run, hf, questions = exported
    _, tok = load_model(str(run))
    theirs = transformers.AutoTokenizer.from_pretrained(hf)
    assert theirs.eos_token == END and theirs.eos_token_id == tok.special_tokens[END]
    assert SYSTEM in tok.special_tokens                                 # grown for the system messages
    for t in [*chat_format.CHAT_TOKENS, SYSTEM]:                        # one id each, as tinyattn's
        assert theirs(t)["input_ids"] == [tok.special_tokens[t]]
    for messages in questions:                                          # each a system and a user message
        ids = theirs.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        assert ids == render_prompt(tok, messages)
        assert ids[0] == tok.special_tokens[SYSTEM] and ids[-1] == tok.special_tokens[chat_format.ASSISTANT]
    whole = questions[0] + [{"role": "assistant", "content": "c a t"}, *questions[1][1:]]
    assert theirs.apply_chat_template(whole)["input_ids"] == render(tok, whole)[0]
    text = f"<|user|>{questions[0][-1]['content']}<|end|><|assistant|>"
    assert theirs(text)["input_ids"] == tok.encode(text, allowed_special="all")
    assert theirs.decode(render_prompt(tok, questions[0])) == tok.decode(render_prompt(tok, questions[0]))
    generation = json.loads((hf / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tok.special_tokens[END]


def test_tinyattn_reads_the_exported_folder_back(exported):
    run, hf, _ = exported
    _, tok = load_model(str(run))
    assert hf_tokenizer(str(hf)).to_dict() == tok.to_dict()                 # --init_from, train.chat
    assert read_tokenizer(str(hf)).to_dict() == tok.to_dict()               # --tokenizer_from


def test_transformers_answers_as_train_chat_does_and_stops_at_end(exported):
    run, hf, questions = exported
    _, tok = load_model(str(run))
    theirs = transformers.AutoTokenizer.from_pretrained(hf)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    end = tok.special_tokens[END]
    ours = piped_answers(run, questions)
    print(f"{run}: {[m[-1]['content'] for m in questions]} -> {ours}")
    assert len(ours) == len(questions) and all(ours)                        # answers, not empty lines
    assert piped_answers(hf, questions) == ours                             # train.chat on the export
    ended = 0
    for messages, said in zip(questions, ours):
        prompt = theirs.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)
        n = prompt["input_ids"].shape[1]
        with torch.no_grad():
            out = model.generate(**prompt, max_new_tokens=64 - n)[0, n:].tolist()     # greedy: the config's
        if out[-1] == end:
            ended += 1
            out = out[:-1]
        assert end not in out                                               # nothing after <|end|>
        assert theirs.decode(out) == said
    assert ended == len(questions)                                          # each answer ended with <|end|>


def test_chat_eval_system_puts_the_system_message_before_each_prompt(exported, tmp_path, monkeypatch):
    import train.chat_eval as chat_eval
    run, _, _ = exported
    _, tok = load_model(str(run))
    (tmp_path / "text.txt").write_text(TEXT)
    read, real = [], chat_eval.answer

    def recording(model, tokenizer, prompts, *args):
        read.extend(prompts)
        return real(model, tokenizer, prompts, *args)

    monkeypatch.setattr(chat_eval, "answer", recording)
    path = tmp_path / "numbers.json"
    assert chat_eval.main(["--out_dir", str(run), "--tasks", "spell", "--n", "4", "--task_text", str(tmp_path / "text.txt"),
                           "--system", BRIEF, "--json", str(path)]) == 0
    asked = [with_system(c)["messages"][:-1] for c in make_task("spell", TEXT).conversations("test", 4)]
    assert read == [render_prompt(tok, messages) for messages in asked]
    assert json.loads(path.read_text())["tasks"]["spell"]["n"] == 4


# --- the chat template itself ---

def char_chat_tokenizer(system):
    tok = CharTokenizer.from_text("spell: cat, be brief. c a t")
    return tok.extended(special_tokens=[*chat_format.CHAT_TOKENS, *([SYSTEM] if system else [])])


def template_tokenizer(tmp_path, tok):
    from tinyattn.models import GPT, GPTConfig
    from train.export_hf import export
    export(GPT(GPTConfig(block_size=32, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)), tok, tmp_path)
    return transformers.AutoTokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize("make", [lambda system: char_chat_tokenizer(system),
                                  lambda system: chat_format.chat_tokenizer(BPE.train(TEXT, 270), []).
                                  with_special_tokens([SYSTEM] if system else [])], ids=["char", "bpe"])
def test_a_system_message_renders_first_with_its_own_token(tmp_path, make):
    tok = make(True)
    theirs = template_tokenizer(tmp_path, tok)
    talk = [{"role": "user", "content": "spell: cat"}, {"role": "assistant", "content": "c a t"},
            {"role": "user", "content": "spell: cat"}]
    system = [{"role": "system", "content": "be brief."}]
    want = [tok.special_tokens[SYSTEM], *tok.encode("be brief."), tok.special_tokens[END], *render_prompt(tok, talk)]
    assert theirs.apply_chat_template(system + talk, add_generation_prompt=True)["input_ids"] == want
    assert theirs.apply_chat_template(system + talk)["input_ids"] == want[:-1]      # no <|assistant|>
    assert render_prompt(tok, system + talk) == want                 # data/chat.py's own rendering
    with pytest.raises(Exception, match="a system message must be the first message"):
        theirs.apply_chat_template(talk[:1] + system)
    with pytest.raises(Exception, match="message 1 is from the user; messages alternate user, assistant"):
        theirs.apply_chat_template(talk[:1] + talk[:1])


def test_without_a_system_token_the_template_refuses_a_system_message(tmp_path):
    theirs = template_tokenizer(tmp_path, char_chat_tokenizer(system=False))
    with pytest.raises(Exception, match="this model has no system token"):
        theirs.apply_chat_template([{"role": "system", "content": "be brief."}, {"role": "user", "content": "cat"}])
    assert SYSTEM not in (tmp_path / "tokenizer_config.json").read_text()


def test_the_template_is_the_format_of_data_chat():
    template = chat_template({"user": chat_format.USER, "assistant": chat_format.ASSISTANT}, END)
    for token in chat_format.CHAT_TOKENS:
        assert f"'{token}'" in template
