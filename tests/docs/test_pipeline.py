"""The assistant pipeline runs as its pages write it: the shell commands of the SFT, DPO, RL and chat
pages, taken from the pages (docs/tools/doccheck.py reads their blocks), run in order in a new
folder laid out like a fresh clone, each one's exit status checked, and the files each reads made
by the commands before it. Only the sizes change: flags the programs already have are appended to
each command (the last of a repeated flag wins), so that the whole pipeline takes seconds; the
pages' text is not changed. A broken command on a page fails the run (shown on a page broken on
purpose)."""
import contextlib
import shlex
import shutil
import subprocess
import sys

import pytest

from test_docs import ROOT, doccheck  # (beside this file: docs/tools/doccheck.py, loaded once)

PIPELINE = ["docs/sft.md", "docs/dpo.md", "docs/rl.md", "docs/chat.md"]     # in the order a reader runs them

# The text: sft.md downloads tiny Shakespeare into input.txt (python data/shakespeare_char.py --out
# input.txt). A test has no network, so that command is skipped and this small text, written as
# input.txt beforehand, stands in for it: 150 distinct words, enough for the tasks' train and test words.
WORDS = ("the king and queen rode over hills and rivers with seven brave knights while wizards kept "
         "their books of old songs in stone towers near quiet forests where deer and foxes play under "
         "bright stars each cold winter night a young girl named rose sang sweet tunes for her mother "
         "father brother sister friends every morning bakers made warm bread honey cakes apples pears "
         "plums grapes lemons berries cherries peaches melons sailors built boats sails ropes nets fish "
         "crabs shells pearls gold silver copper iron swords shields helmets horses wagons wheels roads "
         "bridges castles gardens roses lilies tulips daisies violets orchids ferns mosses vines trees "
         "oaks pines maples birches willows cedars elms ashes hollies yews palms figs olives dates nuts "
         "seeds roots leaves stems buds blooms petals thorns")
TEXT = "".join(f"{' '.join(WORDS.split()[i:i + 9]).capitalize()}.\n"
               for r in range(12) for i in range(r % 5, len(WORDS.split()), 9))

SKIPPED = {
    "data/shakespeare_char.py": "it downloads tiny Shakespeare; the test writes a small input.txt in its place",
}
# files a page names as the reader's own (<!-- inputs: -->) that the test supplies
SPELL = ["rose", "king", "deer", "fox", "gold", "stone", "bread", "honey", "pear", "plum", "fish", "oak"]
SUPPLIED = {
    "questions.txt": "spell: rose\nhow many e in tree?\nreverse: king\n",
    "prompts.jsonl": "".join(f'{{"prompt": "spell: {w}", "answer": "{" ".join(w)}"}}\n' for w in SPELL),
    "my_rewards.py": ("def score(completions, answer, **kwargs):\n"
                      "    \"\"\"The share of the answer's letters in their places.\"\"\"\n"
                      "    texts = [c if isinstance(c, str) else c[-1]['content'] for c in completions]\n"
                      "    return [sum(x == y for x, y in zip(t, a)) / len(a) for t, a in zip(texts, answer)]\n"),
}
# a reader's own run that the pipeline does not make: the commands that read it are placeholders
PLACEHOLDERS = {"RUN": "RUN is the reader's own run, fine-tuned on conversations with a system message"}
STDIN = "spell: rose\n"          # what the interactive chat reads (then end of input: it ends)


def small(command):
    """The flags appended to a command of the pages so that it runs in a second or two."""
    args = command.args
    if command.program == "train" and "--init_from" not in args:            # the base: a tiny model
        return ["--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--max_iters", "4", "--eval_iters", "2",
                "--eval_interval", "2", "--sample_tokens", "0"]
    if command.program == "train" and "--stage" in args and args[args.index("--stage") + 1] == "rl":
        return ["--max_iters", "2", "--eval_interval", "1", "--rl_prompts", "4", "--rl_samples", "2",
                "--rl_eval_prompts", "6", "--rl_max_tokens", "8"]
    if command.program == "train":                                          # SFT and DPO
        return ["--max_iters", "4", "--eval_iters", "2", "--eval_interval", "2", "--batch_size", "8"]
    return {"data.tasks": ["--n", "40"], "data.pairs": ["--n", "40", "--n_test", "8"],
            "train.chat_eval": ["--n", "4"]}.get(command.program, [])


def page_commands(name, text):
    """[(where, words, redirect, stdin, Command)] of a page's shell blocks, in order: the words as the
    page writes them (loops unrolled, comments dropped)."""
    found = []
    for block in doccheck.blocks(text):
        if block.lang not in ("bash", "sh", "console", "shell"):
            continue
        for line in doccheck.expand_loops(doccheck.shell_lines(block)):
            parts = doccheck.split_line(line)
            assert len(parts) == 1, f"{name}:{block.line}: {line!r}: this test runs one command a line"
            words, redirect, stdin = parts[0]
            found.append((f"{name}:{block.line}", words, redirect, stdin, doccheck.to_command(words, redirect, stdin)))
    return found


def run_pages(names, texts, folder, timeout=300):
    """Run the pages' commands in order in ``folder`` -> {"ran": [...], "skipped": [(command, reason)]}.
    A command that exits non-zero, reads a file no command made, or does not write what it says it
    writes fails, naming its page and block."""
    ran, skipped = [], []
    for name in names:
        for where, words, redirect, stdin, command in page_commands(name, texts[name]):
            shown = " ".join([shlex.join(words)] + [f"< {shlex.quote(p)}" for p in stdin] +
                             [f"> {shlex.quote(p)}" for p in redirect])
            reason = SKIPPED.get(command.program)
            reads, writes = doccheck.files_of(command)
            reason = reason or next((why for path, why in PLACEHOLDERS.items() if path in reads), None)
            if reason:
                skipped.append((shown, reason))
                continue
            missing = [p for p in reads if not (folder / p).exists()]
            assert not missing, f"{where}: {shown} reads {', '.join(missing)}, which no command before it made"
            argv = [sys.executable if words[0] in ("python", "python3") else words[0], *words[1:], *small(command)]
            with contextlib.ExitStack() as files:
                reading = dict(stdin=files.enter_context(open(folder / stdin[0]))) if stdin else dict(input=STDIN)
                out = files.enter_context(open(folder / redirect[0], "w")) if redirect else subprocess.PIPE
                done = subprocess.run(argv, cwd=folder, stdout=out, stderr=subprocess.PIPE, text=True,
                                      timeout=timeout, **reading)
            tail = "\n".join(done.stderr.strip().splitlines()[-5:])
            assert done.returncode == 0, f"{where}: {shown} (with {shlex.join(argv[len(words):])}) exited " \
                                         f"{done.returncode}:\n{tail}"
            absent = [p for p in writes + redirect if not (folder / p).exists()]
            assert not absent, f"{where}: {shown} exited 0 without writing {', '.join(absent)}"
            ran.append(shown)
    return dict(ran=ran, skipped=skipped)


def fresh_clone(folder):
    """A folder as a fresh clone has what the pages' commands read from it (config/ and its presets;
    the programs themselves import from this checkout, which is on PYTHONPATH), the text, and the
    reader's own files."""
    shutil.copytree(ROOT / "config", folder / "config")
    (folder / "input.txt").write_text(TEXT)
    for path, content in SUPPLIED.items():
        (folder / path).write_text(content)
    return folder


def test_the_assistant_pipeline_runs_as_its_pages_write_it(tmp_path):
    pages = doccheck.pages()
    done = run_pages(PIPELINE, pages, fresh_clone(tmp_path))
    assert [reason for _, reason in done["skipped"]] == [SKIPPED["data/shakespeare_char.py"]] + \
        [PLACEHOLDERS["RUN"]] * 2                                            # nothing else left out
    programs = [shlex.split(c)[2] if c.startswith("python -m") else shlex.split(c)[0] for c in done["ran"]]
    for program in ("train", "data.tasks", "data.prepare", "train.chat_eval", "data.pairs", "train.dpo",
                    "train.chat"):
        assert program in programs
    assert len(done["ran"]) >= 20
    for run in ("out-base", "out-sft", "out-sft-mix", "out-dpo", "out-rpo", "out-rl", "out-rl-mine"):
        assert (tmp_path / run / "ckpt.npz").is_file(), run
    answers = (tmp_path / "answers.txt").read_text().split("\n")
    assert len(answers) == len(SUPPLIED["questions.txt"].splitlines()) + 1 and answers[-1] == ""   # a line each


def test_a_broken_command_on_a_page_fails_the_run(tmp_path):
    """A page whose second command reads a file that is not there (the first writes another name)
    stops the run there, naming the page, its block and the command, with the program's error."""
    page = ("# A page\n\n```bash\n"
            "python -m data.tasks spell --text input.txt --split train --n 2000 --out spell.jsonl\n"
            "python -m data.prepare spells.jsonl --out_dir conv\n"
            "```\n")
    fresh_clone(tmp_path)
    (tmp_path / "spells.jsonl").write_text("not json\n")            # there, so only running it finds the fault
    with pytest.raises(AssertionError) as e:
        run_pages(["docs/broken.md"], {"docs/broken.md": page}, tmp_path)
    message = str(e.value)
    assert message.startswith("docs/broken.md:4: python -m data.prepare spells.jsonl --out_dir conv")
    assert "exited 1" in message and "spells.jsonl line 1: not JSON" in message
    assert (tmp_path / "spell.jsonl").is_file()                       # the first ran, with its size appended
    assert len((tmp_path / "spell.jsonl").read_text().splitlines()) == 40
