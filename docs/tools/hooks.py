"""The site's build step (mkdocs.yml: hooks): every command's flags, written from its own parser,
and the pages' markers for the docs' tests, shown to the reader."""
import argparse
import html
import importlib.util
import re
import sys
from pathlib import Path

if "doccheck" not in sys.modules:               # the tools are files, not a package: loaded from beside this one
    _spec = importlib.util.spec_from_file_location("doccheck", Path(__file__).with_name("doccheck.py"))
    sys.modules["doccheck"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["doccheck"])
doccheck = sys.modules["doccheck"]

FLAGS = re.compile(r"^<!--\s*flags:\s*(\S+)\s*-->$", re.M)


def command_line(program):
    return f"python {program}" if program.endswith(".py") else f"python -m {program}"


def cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def flags_table(program):
    """One program's flags as a table: flag, value, default, what it does."""
    parser = doccheck.program_parser(program)
    formatter = parser._get_formatter()
    rows = ["| flag | value | default | what it does |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}` (positional)"
        if action.nargs == 0:
            value = ""
        elif action.choices:
            value = " \\| ".join(f"`{c}`" for c in action.choices)
        else:
            value = f"`{formatter._metavar_formatter(action, action.dest.upper())(1)[0]}`"
        default = "" if action.default in (None, argparse.SUPPRESS, False, []) or action.nargs == 0 \
            else f"`{action.default}`"
        helptext = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {name} | {cell(value)} | {cell(default)} | {cell(html.escape(helptext))} |")
    description = (parser.description or "").strip().split("\n\n")[0]
    return "\n".join([f"## `{command_line(program)}`", "", cell(description), "", *rows, ""])


def on_page_markdown(markdown, page, config, files):
    def flags(m):
        names = doccheck.programs() if m.group(1) == "all" else [m.group(1)]
        return "\n".join(flags_table(p) for p in names)
    markdown = doccheck.expand_snippets(markdown)      # EXERCISES.md's parts, so that their markers show too
    markdown = FLAGS.sub(flags, markdown)
    markdown = doccheck.NOT_RUN.sub(lambda m: f'!!! note "Not run by the docs\' tests: {m.group(1)}"\n', markdown)
    markdown = doccheck.INPUTS.sub(
        lambda m: "!!! info \"What you supply\"\n    " + ", ".join(f"`{p}`" for p in m.group(1).split())
        + ": the commands below read these; the page makes no other file they need.\n", markdown)
    markdown = doccheck.UNCHECKED.sub(lambda m: f'!!! note "Commands not checked by the docs\' tests"\n    {m.group(1)}\n',
                                      markdown)
    return markdown
