"""The options reference kept in the checkout (docs/reference/options.md) is what the
command line's parsers make now: the site makes it afresh as it is built (docs/hooks.py),
and this keeps the Markdown that readers of the checkout see from drifting."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_options_reference_is_current():
    made = hooks().options_reference()
    kept = (ROOT / "docs" / "reference" / "options.md").read_text()
    assert kept == made, "docs/reference/options.md is out of date: run python docs/hooks.py"


def test_the_reference_names_every_option_of_train():
    from mpips.cli.main import build_parser

    made = hooks().options_reference()
    train = hooks()._subcommands(build_parser())["train"]
    flags = [a.option_strings[-1] for a in train._actions if a.option_strings]
    missing = [f for f in flags if f"`{f}" not in made and f != "--help"]
    assert not missing, missing
