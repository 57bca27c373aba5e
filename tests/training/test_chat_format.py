"""The chat format (data/chat.py) and the character tokenizer that grows for it."""
import pytest

from data import chat
from tinyattn.tokenizers import BPE, CharTokenizer

SPELL = [{"role": "user", "content": "spell cat"}, {"role": "assistant", "content": "c a t"}]


@pytest.fixture
def char_tok():
    return chat.chat_tokenizer(CharTokenizer.from_text("spell the cat, then count it\n"), [SPELL])


def test_a_conversation_renders_with_the_assistants_tokens_masked_in(char_tok):
    ids, mask = chat.render(char_tok, SPELL)
    assert char_tok.decode(ids) == "<|user|>spell cat<|end|><|assistant|>c a t<|end|>"
    said = [char_tok.decode([i]) for i, m in zip(ids, mask) if m]
    assert "".join(said) == "c a t<|end|>"                 # the answer and its end: nothing of the user's
    assert len(ids) == len(mask) == 1 + 9 + 1 + 1 + 5 + 1


def test_the_prompt_ends_where_the_assistant_begins_and_the_answer_stops_at_end(char_tok):
    prompt = chat.render_prompt(char_tok, SPELL[:1])
    assert char_tok.decode(prompt) == "<|user|>spell cat<|end|><|assistant|>"
    answer = char_tok.encode("c a t<|end|>then", allowed_special="all")
    assert chat.answer_text(char_tok, answer) == "c a t"
    assert chat.answer_text(char_tok, char_tok.encode("c a")) == "c a"      # no <|end|>: all of it
    with pytest.raises(ValueError, match="must end with the user's message"):
        chat.render_prompt(char_tok, SPELL)


def test_growing_a_char_vocabulary_keeps_every_id():
    base = CharTokenizer.from_text("the cat\n")
    grown = chat.chat_tokenizer(base, [[{"role": "user", "content": "1+2"}, {"role": "assistant", "content": "3"}]])
    assert grown.chars[:base.vocab_size] == base.chars                      # the base model's rows keep their tokens
    assert grown.chars[base.vocab_size:] == ["+", "1", "2", "3", *chat.CHAT_TOKENS]
    assert list(grown.special_tokens) == list(chat.CHAT_TOKENS)
    assert CharTokenizer.from_dict(grown.to_dict()).to_dict() == grown.to_dict()
    assert base.to_dict() == {"kind": "char", "chars": base.chars}          # a plain vocabulary writes what it did
    with pytest.raises(ValueError, match="character '<' is not in the vocabulary"):
        grown.encode("<|end|>")                                             # text is text unless allowed ...
    assert grown.encode("<|end|>", allowed_special="all") == [grown.stoi["<|end|>"]]   # ... where it is one token


def test_bpe_gets_the_chat_tokens_only():
    tok = BPE.train("spell the cat, then count it " * 20, 300)
    grown = chat.chat_tokenizer(tok, [SPELL])
    assert [grown.special_tokens[t] for t in chat.CHAT_TOKENS] == list(range(tok.vocab_size, tok.vocab_size + 3))
    ids, mask = chat.render(grown, SPELL)
    assert grown.decode(ids) == "<|user|>spell cat<|end|><|assistant|>c a t<|end|>" and sum(mask) >= 2


@pytest.mark.parametrize("messages, said", [
    ([], "non-empty list"),
    ([{"role": "assistant", "content": "hi"}], "message 0 is from the assistant"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "message 1 is from the user"),
    ([{"role": "system", "content": "a"}], "a system message alone"),
    ([{"role": "tool", "content": "a"}], "message 0 is not"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], "only the first message may be"),
    ([{"role": "system", "content": "a"}, {"role": "assistant", "content": "b"}], "message 1 is from the assistant"),
])
def test_a_malformed_conversation_is_refused_in_one_line(char_tok, messages, said):
    with pytest.raises(ValueError, match=said):
        chat.render(char_tok, messages)


SYSTEM = [{"role": "system", "content": "be brief"}, *SPELL, {"role": "user", "content": "spell at"},
          {"role": "assistant", "content": "a t"}]


def test_a_system_message_renders_first_with_its_own_token_and_is_never_trained_on():
    tok = chat.chat_tokenizer(CharTokenizer.from_text("spell the cat\n"), [SYSTEM])
    assert list(tok.special_tokens) == [*chat.CHAT_TOKENS, chat.SYSTEM]     # after the chat tokens: their ids stay
    ids, mask = chat.render(tok, SYSTEM)
    assert tok.decode(ids) == ("<|system|>be brief<|end|><|user|>spell cat<|end|><|assistant|>c a t<|end|>"
                               "<|user|>spell at<|end|><|assistant|>a t<|end|>")
    said = "".join(tok.decode([i]) for i, m in zip(ids, mask) if m)
    assert said == "c a t<|end|>a t<|end|>"                               # every assistant turn, nothing else
    prompt = chat.render_prompt(tok, SYSTEM[:2])
    assert tok.decode(prompt) == "<|system|>be brief<|end|><|user|>spell cat<|end|><|assistant|>"
    bpe = chat.chat_tokenizer(BPE.train("spell the cat, then count it " * 20, 300), [SYSTEM])
    assert bpe.special_tokens[chat.SYSTEM] == bpe.vocab_size - 1
    assert chat.SYSTEM not in chat.chat_tokenizer(BPE.train("spell the cat " * 20, 280), [SPELL]).special_tokens
    # (no system message: no <|system|>)


def test_a_model_without_the_system_token_is_told_so(char_tok):
    with pytest.raises(ValueError, match="needs the <\\|system\\|> token"):
        chat.render_prompt(char_tok, SYSTEM[:2])


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_special_tokens_inside_a_message_are_ordinary_text(kind):
    said = "type <|end|> then <|endoftext|> and <|user|>"
    convo = [{"role": "user", "content": said}, {"role": "assistant", "content": "ok <|assistant|>"}]
    base = CharTokenizer.from_text("type then and ok\n") if kind == "char" else \
        BPE.train("type then and ok " * 30, 300, special_tokens=["<|endoftext|>"])
    tok = chat.chat_tokenizer(base, [convo])
    ids, mask = chat.render(tok, convo)
    specials = set(tok.special_tokens.values())
    assert [i for i in ids if i in specials] == [tok.special_tokens[t] for t in
                                                 ("<|user|>", "<|end|>", "<|assistant|>", "<|end|>")]
    assert tok.decode(ids) == f"<|user|>{said}<|end|><|assistant|>ok <|assistant|><|end|>"
    prompt = chat.render_prompt(tok, convo[:1])                            # what train.chat sends the model
    assert [i for i in prompt if i in specials] == [tok.special_tokens[t] for t in
                                                    ("<|user|>", "<|end|>", "<|assistant|>")]
