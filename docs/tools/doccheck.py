"""What keeps the site's text and the code together: the pages' code blocks, and every command's
own argument parser.

The tests (tests/docs/) run each page's ```python blocks and parse each command of its
```bash, ```sh and ```console blocks with the program it calls; the site's build (hooks.py)
writes the flags of every command from the same parsers. Run from the repository root.

Markers a page may hold (HTML comments, so they do not show on GitHub; the site shows them):

    <!-- not run: REASON -->        the next code block is not run (a GPU, minutes of training,
                                    transformers, mpiexec); its commands are still parsed
    <!-- inputs: FILE FILE ... -->  files and folders the reader supplies (or makes on another
                                    page), which the page's commands may read
    <!-- commands not checked: REASON -->   the next shell block only is a dated record whose
                                    commands are not parsed (a flag since renamed); say why.
                                    Every other block of the page, and every results table's
                                    row, is still checked
"""
import argparse
import contextlib
import glob
import importlib
import io
import os
import re
import runpy
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->")
INPUTS = re.compile(r"<!--\s*inputs:\s*(.*?)\s*-->", re.S)
UNCHECKED = re.compile(r"<!--\s*commands not checked:\s*(.*?)\s*-->", re.S)
SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"\s*$', re.M)
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


# ---------------------------------------------------------------- pages and their blocks

def expand_snippets(text, base=ROOT):
    """pymdownx.snippets' `--8<-- "FILE:section"` lines, replaced by that section of FILE."""
    def section(m):
        source = (base / m.group(1)).read_text()
        if not m.group(2):
            return source
        part = re.search(rf"--8<-- \[start:{m.group(2)}\][^\n]*\n(.*?)\n[^\n]*--8<-- \[end:{m.group(2)}\]", source, re.S)
        if part is None:
            raise ValueError(f"{m.group(1)} has no section {m.group(2)!r}")
        return part.group(1)
    return SNIPPET.sub(section, text)


def pages():
    """{name: text}: README.md and every page of the site, snippets expanded."""
    paths = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return {str(p.relative_to(ROOT)): expand_snippets(p.read_text()) for p in paths
            if "tools" not in p.relative_to(ROOT).parts}


@dataclass
class Block:
    lang: str
    code: str
    line: int                  # where the block's first line of code is, 1-based
    not_run: str = None        # the reason, when the page marks it so
    unchecked: str = None      # why its commands are not parsed, when the page marks it so


def blocks(text):
    """The fenced code blocks of a page, in order."""
    found = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
        reason, record = NOT_RUN.search(before), UNCHECKED.search(before)
        body = "\n".join(line[len(m.group("indent")):] for line in m.group("body").split("\n"))
        found.append(Block(m.group("lang"), body, text.count("\n", 0, m.start()) + 2,
                           reason.group(1) if reason else None, record.group(1) if record else None))
    return found


def reader_inputs(text):
    return {p for m in INPUTS.finditer(text) for p in m.group(1).split()}


def run_python_blocks(name, text):
    """Run a page's ```python blocks in order, in one namespace, as a notebook runs its cells.
    -> the reasons of the blocks that were not run. A block that raises raises, naming the page
    and the block's line."""
    namespace = {"__name__": "__main__"}
    skipped = []
    for b in blocks(text):
        if b.lang != "python":
            continue
        if b.not_run:
            skipped.append(b.not_run)
            continue
        code = compile("\n" * (b.line - 1) + b.code, name, "exec")   # tracebacks name the page's line
        exec(code, namespace)
    return skipped


# ---------------------------------------------------------------- the programs and their parsers

class _Captured(Exception):
    def __init__(self, parser):
        self.parser = parser


@contextlib.contextmanager
def _capturing():
    """argparse stops at its first parse_args or parse_known_args and hands over the parser."""
    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args

    def stop(self, *args, **kwargs):
        raise _Captured(self)
    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved


def program_parser(program):
    """The parser of a program: "train", "data.prepare" (python -m) or "bench/bench_step.py".

    A module with build_parser() gives it; otherwise the program runs as its command line does,
    up to the moment it parses, and stops there: nothing after the parse runs."""
    if program == "train":
        from train.config import build_parser
        return build_parser()
    argv0, path = sys.argv, sys.path[:]
    try:
        if program.endswith(".py"):
            script = ROOT / program
            sys.argv, sys.path[0:0] = [str(script)], [str(script.parent)]
            with _capturing():
                runpy.run_path(str(script), run_name="__main__")
        else:
            module = importlib.import_module(program)
            if hasattr(module, "build_parser") and not hasattr(module, "__path__"):
                return module.build_parser()
            sys.argv = [program]
            with _capturing(), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)      # "found in sys.modules": it was imported above
                runpy.run_module(program, run_name="__main__", alter_sys=True)
    except _Captured as c:
        return c.parser
    finally:
        sys.argv, sys.path[:] = argv0, path
    raise RuntimeError(f"{program} never parsed a command line")


def programs():
    """Every program of the project with a command line: the modules run with `python -m` and
    the scripts run by their path, found by their use of argparse (so a new one is not missed)."""
    found = []
    for path in sorted([*ROOT.glob("train/**/*.py"), *ROOT.glob("data/*.py"), *ROOT.glob("exercises/__main__.py"),
                        *ROOT.glob("tinyattn/fast/__main__.py"), *ROOT.glob("bench/*.py"),
                        ROOT / "docs" / "tools" / "make_pictures.py"]):
        source = path.read_text()
        if not re.search(r"parse_(known_)?args\(", source) or "__main__" not in source and path.name != "__main__.py":
            continue
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("bench", "docs") or rel == Path("data/shakespeare_char.py"):
            found.append(str(rel))                        # run by its path
        elif rel.name == "__main__.py":
            found.append(".".join(rel.parts[:-1]))
        elif rel.name != "config.py" and rel.name != "cli.py":
            found.append(".".join(rel.with_suffix("").parts))
    return ["train", *[p for p in found if p != "train" and p != "train.command"]]


@contextlib.contextmanager
def _in(folder):
    was = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(was)


def parse(program, args):
    """Parse a command line with the program's own parser, running nothing.
    -> None if it parses, else the program's one-line error."""
    parser = program_parser(program)
    err = io.StringIO()
    try:           # from the repository root, where the pages' commands run (config/sft.py)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), _in(ROOT):
            if program == "train" and "--resume" not in args:
                from train.config import parse_args         # the whole check, config files included
                parse_args(args)                             # (--resume reads the run's folder: flags only)
            elif program == "train.experiments.seeds":
                _, rest = parser.parse_known_args(args)
                parse("train", [a for a in rest if a != "--"]) and parser.error(parse("train", rest))
            else:
                parser.parse_args(args)
    except SystemExit as e:
        if e.code:
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit status {e.code}"
    return None


# ---------------------------------------------------------------- shell commands

# programs a page may call that are not the project's: left alone
KNOWN = {"pip", "pip3", "pytest", "cd", "export", "source", ".", "cat", "ls", "mkdir", "rm", "cp", "mv", "echo",
         "git", "apt-get", "sudo", "mkdocs", "head", "tail", "tee", "less", "nvidia-smi", "bash", "sh", "unset",
         "wc", "sleep", "kill", "jupyter", "chromium", "venv", "find", "grep", "diff", "python"}
WRAPPERS = {"timeout": 1, "nohup": 0, "time": 0, "env": 0}     # name: how many arguments of its own it takes

# the files and folders a program reads (inputs) and writes (outputs), by flag; "" is the positional
READS = {
    "train": ["", "--data", "--init_from", "--mix_data"],
    "train.sample": ["--out_dir"], "train.chat": ["--out_dir"], "train.chat_eval": ["--out_dir", "--text"],
    "train.explore": ["--out_dir"], "train.export_hf": ["--out_dir"], "train.dpo": ["--out_dir", "--data"],
    "train.experiments.heads": ["--out_dir"], "train.experiments.sinks": ["--out_dir"],
    "data.prepare": ["", "--val", "--tokenizer_from"], "data.tasks": ["--text"], "data.pairs": ["--text"],
    "bench/bench_tokenizers.py": [""],
}
WRITES = {"train": ["--out_dir"], "data.prepare": ["--out_dir"], "data.tasks": ["--out"], "data.pairs": ["--out_dir"],
          "train.export_hf": ["--to"], "data/shakespeare_char.py": ["--out"]}
DEFAULT_WRITES = {"data/shakespeare_char.py": lambda args: ["data/shakespeare_char/input.txt"],
                  "train": lambda args: ["out" if "--data" in args else "out-coref"]}


@dataclass
class Command:
    program: str                # "train", "bench/bench_step.py", or a KNOWN name
    args: list
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)


def shell_lines(block):
    """A block's commands, one a string: continuation lines joined, `$ ` prompts of a console
    block taken (its other lines are output), comments dropped."""
    text = block.code.replace("\\\n", " ")
    lines = text.split("\n")
    if block.lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    return [line for line in lines if line.strip() and not line.strip().startswith("#")]


def expand_loops(lines):
    """`for VAR in A B C; do` ... `done` -> the body once per value, $VAR filled in."""
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"\s*for (\w+) in (.*?);\s*do\s*(.*)$", lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        var, values, rest = m.group(1), shlex.split(m.group(2)), m.group(3)
        one_line = re.match(r"(.*?);?\s*done\s*$", rest)          # for x in a b; do cmd $x; done
        body, i = ([one_line.group(1) if one_line else rest] if rest.strip() else []), i + 1
        while not one_line and i < len(lines) and not re.match(r"\s*done\b", lines[i]):
            body.append(lines[i])
            i += 1
        i += 0 if one_line else 1
        for value in values:
            out += expand_loops([re.sub(rf"\$\{{?{var}\}}?\b", value, line) for line in body])
    return out


def split_line(line):
    """One shell line -> its simple commands, each a list of words, the files it redirects its
    output to, and the files it reads on stdin: quotes, comments, &&, ||, ;, |, > and < read as
    the shell reads them."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    parts, words, redirect, stdin, expect = [], [], [], [], None
    for token in lexer:
        if expect is not None:
            expect.append(token)
            expect = None
        elif token in (">", ">>", "&>"):
            if words and words[-1] == "2":               # 2> FILE
                words.pop()
            expect = redirect
        elif token == "<":
            expect = stdin
        elif token in ("&&", "||", ";", "|", "&"):
            parts.append((words, redirect, stdin))
            words, redirect, stdin = [], [], []
        else:
            words.append(token)
    parts.append((words, redirect, stdin))
    return [(w, r, i) for w, r, i in parts if w or r or i]


def commands(block):
    """The commands of a shell block, parsed into programs and arguments."""
    found = []
    for line in expand_loops(shell_lines(block)):
        for words, redirect, stdin in split_line(line):
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):    # VAR=value command
                words = words[1:]
            while words and os.path.basename(words[0]) in WRAPPERS:
                words = words[1 + WRAPPERS[os.path.basename(words[0])]:]
            if words and words[0] == "mpiexec":
                words = words[1:]
                while words and words[0].startswith("-"):
                    words = words[2:] if words[0] in ("-n", "-np") else words[1:]
            if not words:
                continue
            found.append(to_command(words, redirect, stdin))
    return found


def to_command(words, redirect, stdin=()):
    if words[0] in ("python", "python3") and len(words) > 1:
        if words[1] == "-m":
            cmd = Command(words[2], words[3:]) if words[2] not in KNOWN else Command(words[2], [])
        elif words[1] == "-c":
            cmd = Command("python", [])
        else:
            cmd = Command(words[1], words[2:])
    else:
        cmd = Command(words[0], words[1:])
    if cmd.program == "cat":
        cmd.reads = [a for a in cmd.args if not a.startswith("-")]
    cmd.writes += redirect
    cmd.reads += stdin
    return cmd


def flag_values(args, flag):
    """The values given to a flag ("" for the positional arguments: those that are not flags'
    values; good enough for the project's commands, whose flags each take one value or none)."""
    values = []
    for i, a in enumerate(args):
        if flag and (a == flag) and i + 1 < len(args):
            values.append(args[i + 1])
        elif flag and a.startswith(flag + "="):
            values.append(a.split("=", 1)[1])
    if not flag:
        i = 0
        while i < len(args):
            a = args[i]
            if a.startswith("--"):
                i += 1 if "=" in a or i + 1 >= len(args) or args[i + 1].startswith("--") else 2
                continue
            values.append(a)
            i += 1
    return values


def files_of(c):
    """(reads, writes) of a project's command: the files and folders it reads (its stdin's too)
    and those it writes (by its flags, or where it writes by default; its redirected output is
    c.writes)."""
    reads = c.reads + [v for flag in READS.get(c.program, []) for v in flag_values(c.args, flag)]
    if c.program == "train" and "--resume" in c.args:
        reads += flag_values(c.args, "--out_dir")
    writes = [v for flag in WRITES.get(c.program, []) for v in flag_values(c.args, flag)]
    if c.program in DEFAULT_WRITES and not writes:
        writes = DEFAULT_WRITES[c.program](c.args)
    if c.program == "train" and "--eval_only" in c.args:         # it evaluates a run, and writes nothing
        writes = []
    if c.program == "data.prepare" and not flag_values(c.args, "--out_dir"):
        source = Path(flag_values(c.args, "")[0])
        vocab = flag_values(c.args, "--vocab_size")
        writes = [str(source.parent / (f"bpe{vocab[0]}" if vocab else "char"))]
    return reads, writes


def check_page(name, text):
    """Every command of a page against its program; every file it reads made before, in the
    repository, or named as the reader's input. -> a list of problems (empty: all good)."""
    problems, made, supplied = [], set(), reader_inputs(text)
    project = set(programs())
    for b in blocks(text):
        if b.lang not in ("bash", "sh", "console", "shell") or b.unchecked:
            continue
        try:
            cmds = commands(b)
        except ValueError as e:
            problems.append(f"{name}:{b.line}: cannot read the shell: {e}")
            continue
        for c in cmds:
            where = f"{name}:{b.line}: {c.program} {shlex.join(c.args)}"
            if c.program in project:
                error = parse(c.program, c.args)
                if error:
                    problems.append(f"{where}: {error}")
                    continue
                reads, writes = files_of(c)
            elif c.program in KNOWN:
                reads, writes = c.reads, c.writes
            elif c.program.endswith(".py") or "." in c.program and not c.program.startswith("-"):
                problems.append(f"{where}: no such program in the project (known: {', '.join(sorted(project))})")
                continue
            else:
                problems.append(f"{where}: unknown command {c.program!r} (the project's programs, or one of "
                                f"{', '.join(sorted(KNOWN))})")
                continue
            for path in reads:
                if not (path in made or path in supplied or (ROOT / path).exists()
                        or any(path.startswith(m.rstrip("/") + "/") for m in made)):
                    problems.append(f"{where}: reads {path}, which no earlier command on the page makes "
                                    "(name it in <!-- inputs: ... --> if the reader supplies it)")
            made.update(writes + c.writes)
    return problems


def results_commands(text):
    """The commands in a page's results tables: each row's `command` cell (a table whose header
    has a column named "command"). -> [(row text, command)]."""
    found = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not (line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s|:-]+\|$", lines[i + 1])):
            continue
        header = [c.strip().lower() for c in line.strip("|").split("|")]
        if "command" not in header:
            continue
        col = header.index("command")
        for row in lines[i + 2:]:
            if not row.startswith("|"):
                break
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]
            found.append((row, cells[col].strip("`").replace("\\|", "|")))
    return found
