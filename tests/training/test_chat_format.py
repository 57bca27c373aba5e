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
    ([{"role": "system", "content": "a"}], "message 0 is not"),
    ([{"role": "user", "content": "say <|end|>"}], "holds a chat token's text"),
])
def test_a_malformed_conversation_is_refused_in_one_line(char_tok, messages, said):
    with pytest.raises(ValueError, match=said):
        chat.render(char_tok, messages)
