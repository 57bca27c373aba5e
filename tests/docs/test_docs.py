"""Docs that cannot drift: every ```python block of README and the site runs (a page's blocks in
order, in one namespace, each page fresh, in a folder of its own); every command of their shell
blocks parses with its program's own parser, and reads only files made before it or named as
the reader's; every results table's command parses; the site builds with --strict. Each check is
also shown failing on a page broken on purpose."""
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tool(name):
    """A module of docs/tools (files, not a package), loaded from its file once."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "tools" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


doccheck = tool("doccheck")

PAGES = doccheck.pages()
WITH_PYTHON = [n for n, t in PAGES.items() if any(b.lang == "python" for b in doccheck.blocks(t))]
WITH_SHELL = [n for n, t in PAGES.items() if any(b.lang in ("bash", "sh", "console") for b in doccheck.blocks(t))]
WITH_RESULTS = [n for n, t in PAGES.items() if doccheck.results_commands(t)]


@pytest.mark.parametrize("name", WITH_PYTHON)
def test_a_pages_python_blocks_run(name, capsys):
    if name in ("docs/tokens.md", "docs/exercises-2.md") or "tinyattn.tokenizers" in PAGES[name]:
        pytest.importorskip("regex")            # the BPE tokenizer's split pattern needs it (the bpe extra)
    doccheck.run_python_blocks(name, PAGES[name])


@pytest.mark.parametrize("name", WITH_SHELL)
def test_a_pages_commands_parse(name):
    problems = doccheck.check_page(name, PAGES[name])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", WITH_RESULTS)
def test_every_results_row_carries_a_command_that_parses(name):
    for row, command in doccheck.results_commands(PAGES[name]):
        programs = {c.program for c in doccheck.commands(doccheck.Block("bash", command, 1))}
        assert programs & set(doccheck.programs()), f"{name}: a row without its whole command: {row}"
        page = f"```bash\n{command}\n```\n"
        problems = doccheck.check_page(name, "<!-- inputs: " + " ".join(_reads(command)) + " -->\n" + page)
        assert not problems, "\n".join(problems)


def _reads(command):
    """A table row's command reads what the reader made on the page (its inputs are named there)."""
    block = doccheck.Block("bash", command, 1)
    return [v for c in doccheck.commands(block) for flag in doccheck.READS.get(c.program, [])
            for v in doccheck.flag_values(c.args, flag)] + ["-"]


def test_the_pages_have_what_they_check():
    """The checks find the blocks: a regex that matched nothing would pass every page."""
    assert len(WITH_PYTHON) >= 8 and len(WITH_SHELL) >= 10 and len(WITH_RESULTS) >= 3
    assert "README.md" in WITH_SHELL and "README.md" in WITH_PYTHON


def test_every_command_is_in_the_reference():
    """The commands page lists every program, each flag written from its parser."""
    assert "<!-- flags: all -->" in (ROOT / "docs" / "reference" / "commands.md").read_text()
    programs = doccheck.programs()
    for expected in ("train", "train.sample", "train.chat", "data.prepare", "data.tasks", "data.pairs",
                     "bench/bench_step.py", "exercises", "tinyattn.fast", "train.experiments.seeds"):
        assert expected in programs
    hooks = tool("hooks")
    table = hooks.flags_table("train")
    assert "`--learning_rate`" in table and "`--data`" in table and "`--resume`" in table


# ---------------------------------------------------------------- each check, failing on a broken page

BROKEN_BLOCK = textwrap.dedent("""\
    # A page

    ```python
    x = 1
    ```

    ```python
    assert x == 2, "the second block sees the first one's x"
    ```
""")


def test_a_block_that_raises_fails():
    with pytest.raises(AssertionError, match="the second block sees"):
        doccheck.run_python_blocks("broken.md", BROKEN_BLOCK)
    # marked not run, it is skipped and its reason returned
    marked = BROKEN_BLOCK.replace("```python\nassert", "<!-- not run: minutes of training -->\n```python\nassert")
    assert doccheck.run_python_blocks("marked.md", marked) == ["minutes of training"]


def test_a_pages_blocks_share_one_namespace_and_each_page_starts_fresh():
    doccheck.run_python_blocks("one.md", "```python\nleft_here = 1\n```\n```python\nassert left_here == 1\n```\n")
    with pytest.raises(NameError):
        doccheck.run_python_blocks("two.md", "```python\nleft_here\n```\n")


@pytest.mark.parametrize("command, expected", [
    ("python -m train --lr 1e-3", "unknown flag --lr"),
    ("python -m train.sample --out_dir out --num_sampels 2", "unknown flag --num_sampels"),
    ("mpiexec -n 2 python -m train --max_iter 5", "unknown flag --max_iter"),
    ("python bench/bench_step.py --no_such_flag", "unrecognized arguments: --no_such_flag"),
    ("for t in spell count; do\n  python -m data.tasks $t --text input.txt --nn 3 --out $t.jsonl\ndone",
     "unrecognized arguments: --nn"),
    ("for t in spell cuont; do\n  python -m data.tasks $t --text input.txt --out $t.jsonl\ndone",
     "invalid choice: 'cuont'"),
    ("python -m train.nothing --x 1", "no such program"),
    ("frobnicate --x 1", "unknown command 'frobnicate'"),
    ("python -m train --data never_made.txt", "reads never_made.txt, which no earlier command on the page makes"),
    ("python -m train.chat --out_dir input.txt < never_made.txt", "reads never_made.txt"),
])
def test_a_command_that_does_not_parse_fails(command, expected):
    page = f"<!-- inputs: input.txt -->\n\n```bash\n{command}\n```\n"
    problems = doccheck.check_page("broken.md", page)
    assert problems and all(expected in p for p in problems), problems


def test_a_dated_record_exempts_its_own_block_only():
    """<!-- commands not checked: ... --> covers the next block, not the page."""
    page = textwrap.dedent("""\
        <!-- commands not checked: run on that day, before --lr was renamed -->
        ```bash
        python -m train --lr 1e-3
        ```

        ```bash
        python -m train --max_iter 5
        ```
    """)
    problems = doccheck.check_page("record.md", page)
    assert len(problems) == 1 and "unknown flag --max_iter" in problems[0], problems
    assert [b.unchecked for b in doccheck.blocks(page)] == ["run on that day, before --lr was renamed", None]


def test_what_a_command_makes_an_later_one_reads():
    page = textwrap.dedent("""\
        <!-- inputs: input.txt -->

        ```bash
        pip install -e ".[dist]"
        export OMP_NUM_THREADS=1
        python -m train --data input.txt --out_dir out-base --max_iters 10
        for t in spell count; do
          python -m data.tasks $t --text input.txt --split train --n 20 --out $t-train.jsonl
        done
        cat spell-train.jsonl count-train.jsonl > train.jsonl
        python -m data.prepare train.jsonl --tokenizer_from out-base --out_dir conv
        mpiexec -n 2 python -m train config/sft.py --init_from out-base --data conv --out_dir out-sft
        timeout 3600 python -m train --resume --out_dir out-sft
        python -m train.chat --out_dir out-sft --temperature 0 < train.jsonl > answers.txt
        cat answers.txt
        pytest tests/docs
        ```
    """)
    assert doccheck.check_page("good.md", page) == []
    assert "reads out-sft" in doccheck.check_page("good.md", page.replace("--out_dir out-sft\n", "\n", 1))[0]


def test_a_results_table_row_carries_its_command():
    page = textwrap.dedent("""\
        | run | loss | command |
        |---|---|---|
        | base | 1.89 | `python -m train --data input.txt --seed 1` |
        | bad | 1.70 | `python -m train --data input.txt --sed 1` |
    """)
    rows = doccheck.results_commands(page)
    assert [c for _, c in rows] == ["python -m train --data input.txt --seed 1", "python -m train --data input.txt --sed 1"]
    assert doccheck.check_page("t.md", f"<!-- inputs: input.txt -->\n```bash\n{rows[0][1]}\n```") == []
    assert doccheck.check_page("t.md", f"<!-- inputs: input.txt -->\n```bash\n{rows[1][1]}\n```") != []


# ---------------------------------------------------------------- the site's build

def mkdocs_build(root, site):
    pytest.importorskip("mkdocs", reason='pip install -e ".[docs]"')
    pytest.importorskip("material", reason='pip install -e ".[docs]"')
    pytest.importorskip("mkdocstrings", reason='pip install -e ".[docs]"')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def copy_of_the_site(tmp_path):
    import shutil
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    for name in ("mkdocs.yml", "EXERCISES.md", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def test_the_site_builds_strictly_and_fetches_nothing(tmp_path):
    run = mkdocs_build(ROOT, tmp_path / "site")
    assert run.returncode == 0, run.stdout + run.stderr
    import re
    for page in (tmp_path / "site").rglob("*.html"):
        tags = re.findall(r"<(?:link|script|img)\b[^>]*>", page.read_text())
        remote = [t for t in tags if re.search(r"(?:src|href)=\"(?:https?:)?//", t)]
        assert not remote, f"{page.name} loads from the network: {remote}"


def test_a_broken_link_fails_the_build(tmp_path):
    root = copy_of_the_site(tmp_path / "repo")
    page = root / "docs" / "errors.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    run = mkdocs_build(root, tmp_path / "site")
    assert run.returncode != 0 and "no-such-page.md" in run.stdout + run.stderr
