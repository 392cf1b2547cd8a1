"""MkDocs hooks (mkdocs.yml `hooks:`): the options reference made from the command line's
parsers as the site is built, and the pictures of bench/results/ taken into the site.

The site's options page is always made afresh; docs/reference/options.md is the same page
kept in the checkout for readers of the Markdown, and tests/unit/test_docs_reference.py
fails when it differs from what the parsers make. `python docs/hooks.py` writes it."""
import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONS_PAGE = "reference/options.md"
OPTIONS_FILE = ROOT / "docs" / OPTIONS_PAGE
# Usage lines are wrapped at the terminal's width: a fixed one, for the same page anywhere.
WIDTH = "100"
BENCH_RESULTS = ROOT / "bench" / "results"
# A page links a bench picture where it lives in the checkout (so the link works on the
# forge too); in the site it is at bench-results/.
BENCH_LINK = "../bench/results/"
BENCH_SITE = "bench-results/"


def _cell(text: str) -> str:
    """Text for one cell of a Markdown table."""
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def _subcommands(parser: argparse.ArgumentParser) -> dict:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise RuntimeError("the command line has no subcommands")


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """An option's help as --help prints it (%(default)s and the like filled in)."""
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action)


def _usage(action: argparse.Action) -> str:
    """`--servers N`, `--format {svmlight,...}`, `FILE`: an option as it is written."""
    if not action.option_strings:
        return action.metavar or action.dest
    flags = ", ".join(action.option_strings)
    if action.nargs == 0:
        return flags
    metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}")
                                 if action.choices else action.dest.upper())
    return f"{flags} {metavar}"


def options_reference() -> str:
    """The page: every command, its description and each group's options with their help."""
    sys.path.insert(0, str(ROOT))
    from mpips.cli.main import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return _reference(build_parser())
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def _reference(main: argparse.ArgumentParser) -> str:
    commands = _subcommands(main)
    lines = ["# Options reference", "",
             "<!-- Made by docs/hooks.py from the command line's parsers: do not edit. -->", "",
             "What `python -m mpips COMMAND --help` prints, as tables, made from the command "
             "line's parsers each time the docs are built (`docs/hooks.py`).", "",
             "Commands: " + ", ".join(f"[{name}](#{name})" for name in commands) + ".", ""]
    for name, parser in commands.items():
        lines += [f"## {name}", "", "```text", parser.format_usage().strip(), "```", ""]
        if parser.description:
            lines += [_cell(parser.description), ""]
        for group in parser._action_groups:
            shown = [a for a in group._group_actions
                     if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
            if not shown:
                continue
            lines += [f"### {name}: {group.title}", "",
                      "| option | what it does |", "| --- | --- |"]
            lines += [f"| `{_cell(_usage(a))}` | {_cell(_help(parser, a))} |" for a in shown]
            lines.append("")
        if parser.epilog:
            lines += ["```text", parser.epilog.strip(), "```", ""]
    return "\n".join(lines)


def on_files(files, config):
    """Add the generated options page and the bench pictures to the site's files."""
    from mkdocs.structure.files import File

    kept = files.get_file_from_path(OPTIONS_PAGE)
    if kept is not None:
        files.remove(kept)
    files.append(File.generated(config, OPTIONS_PAGE, content=options_reference()))
    for picture in sorted(BENCH_RESULTS.glob("*.png")):
        files.append(File.generated(config, BENCH_SITE + picture.name,
                                    abs_src_path=str(picture)))
    return files


def on_page_markdown(markdown, page, config, files):
    """Links to bench/results/ pictures point where the site has them."""
    depth = page.file.src_uri.count("/")
    return markdown.replace(BENCH_LINK, "../" * depth + BENCH_SITE)


if __name__ == "__main__":
    OPTIONS_FILE.parent.mkdir(exist_ok=True)
    OPTIONS_FILE.write_text(options_reference())
    print(f"wrote {OPTIONS_FILE.relative_to(ROOT)}")
