"""docs/architecture.md stays the map of the code: its module tables (the `| module | holds |`
tables under each package's heading) name every module of the tree once and none that is
gone, and the picture and generated block that docs/draw_layout.py draws are up to date."""
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MPIPS = ROOT / "mpips"
DOC = ROOT / "docs" / "architecture.md"

TABLE_HEAD = "| module | holds |"
PACKAGE_HEADING = re.compile(r"^\*\*`([a-z_]+)/`\*\*")   # **`server/`** (tier 8): ...
FACE_HEADING = "**The face**"                            # mpips/__init__.py, __main__.py, api.py


def modules_in_tree() -> set:
    """'server/loop', 'kernels/table', ...; the face's as '__init__', '__main__', 'api'.
    A package's __init__ is its docstring only, and is not a module of the tables."""
    found = set()
    for path in MPIPS.rglob("*.py"):
        parts = path.relative_to(MPIPS).with_suffix("").parts
        if len(parts) == 1:
            found.add(parts[0])
        elif parts[-1] != "__init__":
            found.add("/".join(parts))
    return found


def modules_in_doc() -> Counter:
    """Each module the tables' first columns name, as modules_in_tree names it, and how
    many rows name it. A name is its package's (the heading above the table) unless it
    gives its package itself (`worker/link`)."""
    named: Counter = Counter()
    package, in_table = None, False
    for line in DOC.read_text().splitlines():
        heading = PACKAGE_HEADING.match(line)
        if heading:
            package = heading.group(1)
        elif line.startswith(FACE_HEADING):
            package = ""
        if line.startswith(TABLE_HEAD):
            in_table = True
            continue
        if not (in_table and line.startswith("|")):
            in_table = False
            continue
        if line.startswith("| ---"):
            continue
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            named[name if "/" in name or not package else f"{package}/{name}"] += 1
    return named


def test_the_doc_has_module_tables():
    assert len(modules_in_doc()) > 50


def test_every_module_is_in_a_table():
    missing = sorted(modules_in_tree() - set(modules_in_doc()))
    assert not missing, (f"docs/architecture.md's module tables lack {missing}: describe "
                         f"each in its package's table")


def test_no_table_names_a_module_that_is_gone():
    gone = sorted(set(modules_in_doc()) - modules_in_tree())
    assert not gone, f"docs/architecture.md's module tables name {gone}, which do not exist"


def test_no_module_is_described_twice():
    twice = sorted(name for name, rows in modules_in_doc().items() if rows > 1)
    assert not twice, f"docs/architecture.md describes {twice} in more than one row"


def test_the_drawn_layout_is_up_to_date():
    check = subprocess.run([sys.executable, "docs/draw_layout.py", "--check"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
