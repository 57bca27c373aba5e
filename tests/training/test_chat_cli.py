"""python -m train.chat: a terminal chat, driven through a pseudo-terminal as a user types it.

The model is a tiny GPT with random weights and a character vocabulary grown with the chat
tokens, written as a checkpoint the way a run writes one. What it says is noise, but noise
that these tests can check: a child process records the ids each turn's model read, and the
streamed ids are checked against GPT.generate. A trained chat run is tried too where
TINYATTN_CHAT_RUN names one (skipped otherwise).
"""
import io
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest

import tinyattn as ta
from data import chat as chat_format
from tinyattn.models import GPT, GPTConfig
from tinyattn.tokenizers import CharTokenizer
from train import chat, checkpoint
from train.data import tokenizer_to_json
from train.sample import load_model

TEXT = "spell the cat, then count it: how many t in that?"      # no newline: an answer is one line


def write_run(out_dir, block_size=48, chat_tokens=True, seed=0, system=None):
    """A run folder with a ckpt.npz as python -m train writes it: a random 1-layer GPT on a
    character vocabulary, grown with the chat tokens unless chat_tokens is False (and with
    <|system|> and the characters of ``system``, a system message's text, as fine-tuning on
    conversations that begin with it grows it). -> tokenizer."""
    tok = CharTokenizer.from_text(TEXT)
    if chat_tokens:
        tok = chat_format.chat_tokenizer(tok, [[{"role": "system", "content": system}]] if system else [])
    ta.manual_seed(seed)
    model = GPT(GPTConfig(block_size=block_size, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16))
    optimizer = model.configure_optimizer(0.1, 1e-3, (0.9, 0.95))
    meta = dict(config=model.config.to_dict(), step=0, best_val_loss=float("inf"), args={"dtype": "float32"},
                tokenizer=tokenizer_to_json(tok))
    checkpoint.save(os.path.join(out_dir, "ckpt.npz"), model, optimizer, meta)
    return tok


# --- the parts, in this process ---

def test_streamed_tokens_are_the_tokens_generate_writes(tmp_path):
    """The token-by-token loop with its KV cache draws what GPT.generate draws, greedy and sampled."""
    write_run(tmp_path, block_size=40)
    model, tok = load_model(str(tmp_path))
    prompt = chat_format.render_prompt(tok, [{"role": "user", "content": "spell cat"}])
    n = model.config.block_size - len(prompt)                  # up to the last position the model reads
    for temperature, top_k in ((0.0, None), (1.0, None), (0.8, 5)):
        ta.manual_seed(3)
        streamed = list(chat.stream(model, prompt, n, temperature, top_k))
        ta.manual_seed(3)
        generated = model.generate(ta.tensor([prompt]), n, temperature=temperature, top_k=top_k)[0].tolist()
        assert streamed == generated[len(prompt):] and len(streamed) == n
    with pytest.raises(ValueError, match="do not fit block_size 40"):
        next(chat.stream(model, prompt, n + 2))      # (the last token is never read: n + 1 fits)


def test_the_stream_stops_at_a_stop_token_and_yields_it(tmp_path):
    write_run(tmp_path)
    model, tok = load_model(str(tmp_path))
    prompt = chat_format.render_prompt(tok, [{"role": "user", "content": "hi"}])
    ta.manual_seed(0)
    free = list(chat.stream(model, prompt, 20, 0.0))
    ta.manual_seed(0)
    stopped = list(chat.stream(model, prompt, 20, 0.0, stop={free[3]}))
    assert stopped == free[:free.index(free[3]) + 1]


def test_a_bpe_character_is_shown_once_all_its_bytes_have_come():
    from tinyattn.tokenizers import BPE
    tok = chat_format.chat_tokenizer(BPE.train("a plain text " * 30, 260), [])
    ids = tok.encode("né")                                     # byte-level: é is two byte tokens here
    assert len(ids) == 3
    out, shown = [], ""
    for i in range(1, len(ids) + 1):
        new = chat.show(tok, ids[:i], shown)
        out.append(new)
        shown += new
    assert out == ["n", "", "é"]


@pytest.mark.parametrize("n, fits", [(32, True), (33, False)])
def test_a_turn_must_leave_room_for_the_answer(n, fits):
    assert (chat.refusal(n, 48, 16, new_conversation=False) is None) == fits
    if not fits:
        assert chat.refusal(n, 48, 16, False) == ("not sent: with this message the conversation is 33 tokens; "
                                                  "the model reads 48, 16 of them kept for the answer: "
                                                  "/clear to start again")
        assert chat.refusal(n, 48, 16, True).endswith("write a shorter one")


def test_an_answer_cut_at_the_limit_and_one_stopped_by_ctrl_c(tmp_path, monkeypatch):
    write_run(tmp_path)
    model, tok = load_model(str(tmp_path))
    prompt = chat_format.render_prompt(tok, [{"role": "user", "content": "hi"}])
    a, t = tok.stoi["a"], tok.stoi["t"]

    def never_ending(*args):                                                    # never <|end|>
        yield from [a, t, a]
    monkeypatch.setattr(chat, "stream", never_ending)
    out = io.StringIO()
    assert chat.answer(model, tok, prompt, 3, 0.0, None, out) == ("ata", "cut")
    assert out.getvalue() == "ata\n"

    def interrupted(*args):
        yield t
        raise KeyboardInterrupt
    monkeypatch.setattr(chat, "stream", interrupted)
    out = io.StringIO()
    assert chat.answer(model, tok, prompt, 3, 0.0, None, out) == ("t", "stopped")
    assert out.getvalue() == "t\n"


# --- the command, through a pseudo-terminal ---

RECORDER = """
import json, os, sys, time
import tinyattn as ta
from train import chat
if os.environ.get("CHAT_NO_END"):               # the model's own tokens, but never a chat token: never <|end|>
    sample = chat.sample_next
    def no_chat_tokens(logits, *args):
        logits = logits.numpy().copy()
        logits[:, sorted(chat.load_model(os.environ["CHAT_RUN"])[1].special_tokens.values())] = -float("inf")
        return sample(ta.tensor(logits), *args)
    chat.sample_next = no_chat_tokens
real = chat.stream
def recording(model, prompt, *args, **kwargs):
    with open(os.environ["CHAT_LOG"], "a") as f:
        f.write(json.dumps(prompt) + "\\n")
    slow = float(os.environ.get("CHAT_SLOW", 0))
    if slow:                                    # a model that talks slowly and never ends
        tok = chat.load_model(os.environ["CHAT_RUN"])[1]
        while True:
            time.sleep(slow)
            yield tok.stoi["a"]
    yield from real(model, prompt, *args, **kwargs)
chat.stream = recording
sys.exit(chat.main(sys.argv[1:]))
"""


WAIT = 120       # seconds a step may take on a busy machine before the test calls it a hang


class Terminal:
    """A child process on a pseudo-terminal: what it prints is read as a user sees it, and
    send() types, as a user does (Ctrl-C as the byte \\x03)."""

    def __init__(self, argv, env=None):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                                      # the child: the command, on the terminal
            try:                                               # in the test's own folder (conftest)
                os.execve(sys.executable, [sys.executable, *argv], {**os.environ, "TERM": "dumb", **(env or {})})
            finally:
                os._exit(127)
        self.seen = ""

    def read(self, timeout):
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:                                        # the child has gone: the terminal is closed
            return False
        if not data:
            return False
        text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        self.seen += re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", text)       # escape codes, carriage returns
        return True

    def expect(self, pattern, timeout=WAIT, keep=False):
        """Read until ``pattern`` (a regex) shows in what was printed since the last expect: -> its
        match. What it matched, and all before it, is not searched again unless ``keep``."""
        deadline = time.time() + timeout
        while True:
            found = re.search(pattern, self.seen)
            if found:
                self.seen = self.seen if keep else self.seen[found.end():]
                return found
            left = deadline - time.time()
            if left <= 0 or not self.read(left):
                raise AssertionError(f"never saw {pattern!r}; the terminal shows {self.seen!r}")

    def send(self, text):
        os.write(self.fd, text.encode())

    def interrupt_at_prompt(self, quiet=10):
        """Ctrl-C at the prompt, until the program answers it (with a new line, then its end).
        Python sees a signal only once it is back in its own code: a Ctrl-C that comes after
        the prompt is printed but before input() waits for a key stays unseen until the next
        key. A user presses Ctrl-C again; so does this, after ``quiet`` seconds of no answer."""
        deadline = time.time() + WAIT
        while time.time() < deadline:
            start = len(self.seen)
            self.send("\x03")
            until = time.time() + quiet
            while time.time() < until:
                if not self.read(until - time.time()):
                    time.sleep(0.1)                            # (the terminal is closed, or quiet)
                if self.seen[start:].replace("^C", ""):        # more than the terminal's echo
                    return
        raise AssertionError(f"Ctrl-C at the prompt had no effect in {WAIT} s; the terminal shows {self.seen!r}")

    def wait(self, timeout=WAIT):
        """-> the exit status, and all that was printed until the end."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.read(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                while self.read(0.1):
                    pass
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status), self.seen
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"still running after {timeout} s; the terminal shows {self.seen!r}")


def recorded_chat(tmp_path, *flags, slow=0, no_end=False):
    run = tmp_path / "run"
    tok = write_run(run)
    log = tmp_path / "prompts.jsonl"
    term = Terminal(["-c", RECORDER, "--out_dir", str(run), "--temperature", "0", *flags],
                    env={"CHAT_LOG": str(log), "CHAT_RUN": str(run), "CHAT_SLOW": str(slow),
                         "CHAT_NO_END": "1" if no_end else ""})
    term.expect(r"reads 48 tokens\. /clear.*\n")
    return term, tok, log


def prompts(log, tok):
    """The conversations the model read, one a turn, as text."""
    return [tok.decode(json.loads(line)) for line in log.read_text().splitlines()]


def test_a_second_answer_reads_the_first_then_clear_starts_again(tmp_path):
    term, tok, log = recorded_chat(tmp_path, "--max_new_tokens", "6", no_end=True)
    term.expect("> ")
    term.send("spell cat\n")
    first = term.expect(r"spell cat\n(.*)\n")[1]                       # the echo, then the answer's line
    term.expect("> ")
    term.send("count it\n")
    second = term.expect(r"count it\n(.*)\n")[1]
    term.expect(r"\(cut at 6 tokens: --max_new_tokens\)\n")
    term.expect("> ")
    term.send("/clear\n")
    term.expect(r"\(a new conversation\)\n> ")
    term.send("then\n")
    term.expect("then\n")
    term.expect("> ")
    term.send("/quit\n")
    status, _ = term.wait()
    assert status == 0
    assert prompts(log, tok) == [
        "<|user|>spell cat<|end|><|assistant|>",
        f"<|user|>spell cat<|end|><|assistant|>{first}<|end|><|user|>count it<|end|><|assistant|>",
        "<|user|>then<|end|><|assistant|>"]
    assert len(first) == len(second) == 6                # noise, 6 characters of it


def test_a_turn_that_does_not_fit_is_refused_and_the_conversation_kept(tmp_path):
    term, tok, log = recorded_chat(tmp_path, "--max_new_tokens", "4", "--min_room", "10", no_end=True)
    term.expect("> ")
    term.send("spell the cat\n")                                         # 16 tokens, 4 answered: 20
    first = term.expect(r"spell the cat\n(.{4})\n")[1]
    term.expect("> ")
    term.send("count the t in that cat\n")                               # + 26, + 10 for the answer > 48
    n = 16 + 4 + 1 + 26
    term.expect(f"not sent: with this message the conversation is {n} tokens; the model reads 48, "
                "10 of them kept for the answer: /clear to start again\n")
    term.expect("> ")
    term.send("then\n")                                                  # + 7, + 10: fits
    term.expect("then\n")
    term.expect("> ")
    term.send("/clear\n")
    term.expect("> ")
    term.send("spell the cat, then count it: how many\n")              # one message alone too long
    term.expect("not sent: this message is 41 tokens; .*: write a shorter one\n")
    term.expect("> ")
    term.send("\x04")                                                    # Ctrl-D
    status, _ = term.wait()
    assert status == 0
    assert prompts(log, tok) == ["<|user|>spell the cat<|end|><|assistant|>",
                                 f"<|user|>spell the cat<|end|><|assistant|>{first}<|end|>"
                                 "<|user|>then<|end|><|assistant|>"]


def test_ctrl_c_stops_an_answer_and_at_the_prompt_ends_the_chat(tmp_path):
    """What the conversation keeps is checked where the program keeps it (the prompt of the next turn),
    not on the screen: when Ctrl-C arrives, the terminal throws away the output the program wrote and
    the screen has not yet shown (a tty flushes its output queue on SIGINT), so on a busy machine the
    screen may show "aaa" of a stopped "aaaa". What it shows is the start of what was kept."""
    term, tok, log = recorded_chat(tmp_path, slow=0.05)
    term.expect("> ")
    term.send("spell cat\n")
    term.expect("spell cat\n")
    term.expect("aaa", keep=True)                                        # it is talking
    term.send("\x03")                                                    # Ctrl-C (the terminal echoes ^C)
    said = term.expect(r"(.*)\n\(stopped: what it said so far stays in the conversation\)\n> ")[1]
    said = said.replace("^C", "")
    assert re.fullmatch("aaa+", said), said
    term.send("it\n")
    term.expect("it\naaa")
    term.send("\x03")
    term.expect("> ")
    term.interrupt_at_prompt()                                           # Ctrl-C at the prompt
    status, shown = term.wait()
    assert status == 0 and "Traceback" not in shown and "KeyboardInterrupt" not in shown
    second = prompts(log, tok)[1]
    kept = re.match(r"<\|user\|>spell cat<\|end\|><\|assistant\|>(a*)<\|end\|><\|user\|>it", second)
    assert kept, second                                                  # the stopped answer, then the next turn
    assert kept[1].startswith(said), (said, kept[1])                     # all that was shown, and maybe more


def test_characters_outside_the_vocabulary_and_unknown_commands_are_one_line_each(tmp_path):
    term, tok, log = recorded_chat(tmp_path)
    term.expect("> ")
    term.send("spell Zebra\n")
    term.expect(r"not sent: character 'Z' is not in the vocabulary\n> ")
    term.send("/help\n")
    term.expect(r"unknown command /help: /clear starts a new conversation, /quit ends\n> ")
    term.send("/quit\n")
    assert term.wait()[0] == 0
    assert not log.exists()                                              # the model read nothing


# --- one-line errors, and input that is not a terminal ---

def run_chat(args, stdin=""):
    return subprocess.run([sys.executable, "-m", "train.chat", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_a_base_model_and_a_missing_run_are_refused_in_one_line(tmp_path):
    write_run(tmp_path / "base", chat_tokens=False)
    out = run_chat(["--out_dir", str(tmp_path / "base")])
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"python -m train.chat: error: the model in {tmp_path / 'base'} has no <|user|> "
                                 "token: fine-tune it on conversations first (python -m train --init_from")
    out = run_chat(["--out_dir", str(tmp_path / "nothing")])
    assert out.returncode == 1 and out.stderr == \
        f"python -m train.chat: error: no checkpoint at {tmp_path / 'nothing'}/ckpt.npz\n"
    for flags, said in ((["--out_dir", "x", "--temperature", "-1"], "argument --temperature"),
                        (["--out_dir", "x", "--top_k", "0"], "argument --top_k: must be at least 1"),
                        ([], "the following arguments are required: --out_dir")):
        out = run_chat(flags)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and said in out.stderr


def test_piped_lines_are_turns_and_only_the_answers_are_printed(tmp_path):
    tok = write_run(tmp_path)
    out = run_chat(["--out_dir", str(tmp_path), "--temperature", "0", "--max_new_tokens", "5"],
                   stdin="spell cat\ncount it\n")
    assert out.returncode == 0, out.stderr
    answers = out.stdout.split("\n")
    assert len(answers) == 3 and answers[2] == "" and all(len(a) <= 5 for a in answers[:2])
    assert "<|" not in out.stdout and all(c in tok.stoi for c in "".join(answers))


def test_a_pipe_gets_one_line_for_each_line_each_its_own_conversation(tmp_path):
    """Eight questions, one of them too long and one with a character the model lacks: eight
    lines out, in order, the refused ones empty with their reasons on stderr, exit status 1.
    Each line is a conversation of its own: its answer is the one it gets asked alone."""
    write_run(tmp_path, block_size=40, seed=2)                 # (seed 2: answers that are not all empty)
    flags = ["--out_dir", str(tmp_path), "--temperature", "0", "--max_new_tokens", "4"]
    questions = ["spell cat", "count it", "the cat " * 4, "", "how many t?", "spell Z", "/clear", "then"]
    out = run_chat(flags, stdin="".join(q + "\n" for q in questions))
    assert out.returncode == 1
    answers = out.stdout.split("\n")
    assert len(answers) == len(questions) + 1 and answers[-1] == ""
    assert [answers[i] for i in (2, 3, 5, 6)] == ["", "", "", ""]      # refused, blank, refused, /clear
    err = [line for line in out.stderr.splitlines() if not line.startswith("(cut at")]
    assert err[0].startswith("not sent: this message is 34 tokens; the model reads 40")
    assert err[1] == "not sent: character 'Z' is not in the vocabulary" and err[2] == "(a new conversation)"
    assert err[3:] == ["python -m train.chat: 2 of 8 lines refused (an empty line for each)"]
    for i in (0, 1, 4, 7):                                    # as if asked alone
        alone = run_chat(flags, stdin=questions[i] + "\n")
        assert alone.returncode == 0 and alone.stdout == answers[i] + "\n"
    # --conversation: the lines are the turns of one conversation, as before
    kept = run_chat([*flags, "--conversation", "--min_room", "4"], stdin="spell cat\ncount it\n")
    model, tok = load_model(str(tmp_path))
    first = kept.stdout.split("\n")[0]
    asked = [{"role": "user", "content": "spell cat"}, {"role": "assistant", "content": first},
             {"role": "user", "content": "count it"}]
    prompt = chat_format.render_prompt(tok, asked)
    ids = model.generate(ta.tensor([prompt]), 4, temperature=0.0)[0].tolist()[len(prompt):]
    stops = [i for i, t in enumerate(ids) if t in [tok.special_tokens[s] for s in chat_format.CHAT_TOKENS]]
    said = tok.decode(ids[:stops[0]] if stops else ids)        # (a chat token, whichever, ends an answer)
    assert kept.returncode == 0 and kept.stdout.split("\n")[1] == said


def test_an_answer_with_newlines_stays_one_line_in_a_pipe(tmp_path, monkeypatch, capsys):
    write_run(tmp_path)
    model, tok = load_model(str(tmp_path))
    monkeypatch.setattr(chat, "answer", lambda *a, **k: ("two\nlines", "end"))
    monkeypatch.setattr(sys, "stdin", io.StringIO("spell cat\n"))
    args = chat.build_parser().parse_args(["--out_dir", str(tmp_path)])
    assert chat.converse(model, tok, args, interactive=False) == 0
    assert capsys.readouterr().out == "two\\nlines\n"


def test_system_needs_a_model_with_a_system_token(tmp_path):
    write_run(tmp_path)
    out = run_chat(["--out_dir", str(tmp_path), "--system", "Be brief."], stdin="spell cat\n")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == (f"python -m train.chat: error: --system: this model has no system token ({chat.SYSTEM}): "
                          "fine-tune it on conversations with system messages first\n")


def test_a_system_message_the_model_cannot_read_is_refused_once(tmp_path):
    write_run(tmp_path, system="Be brief.")
    out = run_chat(["--out_dir", str(tmp_path), "--system", "Zut!"], stdin="spell cat\nspell that\n")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == "python -m train.chat: error: --system: character 'Z' is not in the vocabulary\n"


def test_system_starts_each_conversation_and_stays_after_clear(tmp_path, monkeypatch, capsys):
    """--system with a model that has <|system|>: each prompt the model reads is data/chat.py's
    render_prompt of [system, user, ...]; /clear starts again from the system message."""
    tok = write_run(tmp_path, system="Be brief.")
    assert chat_format.SYSTEM in tok.special_tokens
    read, real = [], chat.stream

    def recording(model, prompt, *args, **kwargs):
        read.append(list(prompt))
        yield from real(model, prompt, *args, **kwargs)

    monkeypatch.setattr(chat, "stream", recording)
    system = {"role": "system", "content": "Be brief."}

    def user(text):
        return {"role": "user", "content": text}

    monkeypatch.setattr(sys, "stdin", io.StringIO("spell cat\ncount it\n"))     # each line its own conversation
    assert chat.main(["--out_dir", str(tmp_path), "--system", "Be brief.", "--temperature", "0",
                      "--max_new_tokens", "3"]) == 0
    assert read == [chat_format.render_prompt(tok, [system, user("spell cat")]),
                    chat_format.render_prompt(tok, [system, user("count it")])]
    assert read[0][:2] == [tok.special_tokens[chat_format.SYSTEM], tok.stoi["B"]]
    assert len(capsys.readouterr().out.split("\n")) == 3                          # two answers

    read.clear()
    monkeypatch.setattr(sys, "stdin", io.StringIO("spell cat\ncount it\n/clear\nspell that\n"))
    assert chat.main(["--out_dir", str(tmp_path), "--system", "Be brief.", "--temperature", "0",
                      "--max_new_tokens", "3", "--min_room", "4", "--conversation"]) == 0
    first = capsys.readouterr().out.split("\n")[0]
    assert read == [chat_format.render_prompt(tok, [system, user("spell cat")]),
                    chat_format.render_prompt(tok, [system, user("spell cat"), {"role": "assistant", "content": first},
                                                    user("count it")]),
                    chat_format.render_prompt(tok, [system, user("spell that")])]


# --- a trained chat model, where there is one ---

@pytest.mark.skipif(not os.environ.get("TINYATTN_CHAT_RUN"),
                    reason="TINYATTN_CHAT_RUN names no fine-tuned run (python -m train --init_from ... --data ...)")
def test_a_fine_tuned_model_spells_in_the_terminal():
    term = Terminal(["-m", "train.chat", "--out_dir", os.environ["TINYATTN_CHAT_RUN"], "--temperature", "0"])
    for word in ("cat", "hello"):
        term.expect("> ", timeout=120)
        term.send("/clear\n")
        term.expect("> ")
        term.send(f"spell: {word}\n")
        assert term.expect(rf"spell: {word}\n(.*)\n")[1].strip() == " ".join(word)
    term.send("/quit\n")
    assert term.wait()[0] == 0
