"""What the README and the user guide (docs/*.md) show runs as written, and prints what they
show. The marks (HTML comments before a fenced block) are described in docs/contributing.md,
"Blocks that run":

    <!-- run -->                  a sh or python block, run as written
    <!-- run: mpiexec -n N -->    a python block, under mpiexec -n N
    <!-- run: fails -->           it must exit non-zero
    <!-- run as: COMMAND -->      a sh block, run as COMMAND (the same on small data)
    <!-- output[: stderr][; numbers vary] -->   the text block after it: what it prints

A page's blocks run in order in one fresh directory. Shown output is matched line by line:
`...` stands for lines left out, elapsed-time stamps and runs of spaces may differ, the
directory shows as /path/to/mpips, and under `numbers vary` every number may differ."""
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import mpiexec_path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHOWN_DIR = "/path/to/mpips"
# What the Makefile exports for Open MPI (as root, more ranks than cores, no libfabric probe).
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_osc": "^ucx",
           "OMPI_MCA_btl": "^ofi"}
MARK = re.compile(r"^<!-- (run|output)(?:(?: as)?: (.*?))? -->\n```(\w*)\n(.*?)^```\n",
                  re.M | re.S)
NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?[kM]?"   # 61.2k examples/s
STAMP = re.compile(r"^\[ *\d+\.\ds\] ")


@dataclass
class Block:
    page: Path
    line: int
    language: str
    code: str
    runner: str = ""          # "", "fails", "mpiexec -n N" or "as: COMMAND"
    output: str | None = None
    output_mode: str = ""


def blocks(page: Path) -> list:
    """The page's runnable blocks, each with the output shown after it."""
    text = page.read_text()
    found: list = []
    for m in MARK.finditer(text):
        kind, option, language, body = m.groups()
        line = text.count("\n", 0, m.start()) + 1
        if kind == "run":
            assert language in ("sh", "python"), f"{page.name}:{line}: a run mark before a " \
                                                  f"{language or 'plain'} block"
            as_command = m.group(0).startswith("<!-- run as:")
            found.append(Block(page, line, language, body,
                               f"as: {option}" if as_command else (option or "")))
        else:
            assert found and found[-1].output is None, \
                f"{page.name}:{line}: an output mark not after a runnable block"
            found[-1].output, found[-1].output_mode = body, option or ""
    return found


def pages_with_blocks() -> list:
    return [p for p in PAGES if blocks(p)]


def environment() -> dict:
    env = {**os.environ, **MPI_ENV}
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    # What a user runs: not a testing launch, nor a sub-make of `make test` (whose make
    # would say "Entering directory" around make run's output).
    for name in ("MPIPS_TESTING", "MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES"):
        env.pop(name, None)
    return env


def workdir(tmp_path: Path) -> Path:
    """A directory in which the Makefile's `make run` finds the checkout's venv, installed:
    its pyproject.toml is an empty one older than any venv, so that make never reinstalls
    the checkout's venv from a test."""
    for name in ("Makefile", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "pyproject.toml").touch()
    os.utime(tmp_path / "pyproject.toml", (0, 0))
    return tmp_path


def run(block: Block, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    if block.runner.startswith("as: "):
        command = ["bash", "-e", "-c", block.runner[4:]]
    elif block.language == "sh":
        command = ["bash", "-e", "-c", block.code]
    else:
        script = cwd / f"block-{block.line}.py"
        script.write_text(block.code)
        command = [sys.executable, script.name]
        if block.runner.startswith("mpiexec -n "):
            command = [mpiexec_path(), "-n", block.runner.split()[-1], *command]
    return subprocess.run(command, cwd=cwd, env=environment(), capture_output=True, text=True,
                          timeout=timeout)


def line_pattern(shown: str, numbers_vary: bool) -> re.Pattern:
    """A shown line as a pattern: its time stamp and runs of spaces free, its numbers too
    under `numbers vary`."""
    stamp = STAMP.match(shown)
    rest = shown[stamp.end():] if stamp else shown
    pieces = re.split(f"({NUMBER})", rest) if numbers_vary else [rest]
    pattern = "".join(NUMBER if i % 2 else r"\s+".join(map(re.escape, re.split(r"\s+", p)))
                      for i, p in enumerate(pieces))
    return re.compile((r"\[ *\d+\.\ds\] " if stamp else "") + pattern + r"\s*$")


def matches(shown: str, printed: str, numbers_vary: bool) -> str | None:
    """None if `printed` is what `shown` shows, else the first shown line not found."""
    lines = printed.splitlines()
    segments: list = [[]]
    for line in shown.rstrip("\n").split("\n"):
        if line == "...":
            segments.append([])
        else:
            segments[-1].append(line_pattern(line, numbers_vary))
    free_start, free_end = not segments[0], not segments[-1]
    segments = [s for s in segments if s]
    at = 0
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        starts = range(1) if i == 0 and not free_start else range(at, len(lines))
        found = None
        for start in starts:
            if start + len(segment) > len(lines):
                break
            if all(p.match(lines[start + j]) for j, p in enumerate(segment)) and \
                    (not last or free_end or start + len(segment) == len(lines)):
                found = start
                break
        if found is None:
            return segment[0].pattern
        at = found + len(segment)
    return None


@pytest.mark.parametrize("page", pages_with_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_runnable_blocks_run_and_print_what_is_shown(page, tmp_path):
    cwd = workdir(tmp_path)
    for block in blocks(page):
        done = run(block, cwd)
        where = f"{page.relative_to(ROOT)}:{block.line}"
        said = f"\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        if block.runner == "fails":
            assert done.returncode != 0, f"{where} should fail{said}"
        else:
            assert done.returncode == 0, f"{where} exited {done.returncode}{said}"
        if block.output is not None:
            modes = [m.strip() for m in block.output_mode.split(";") if m.strip()]
            printed = done.stderr if "stderr" in modes else done.stdout
            printed = printed.replace(str(cwd), SHOWN_DIR)
            missing = matches(block.output, printed, "numbers vary" in modes)
            assert missing is None, f"{where}: no line printed matches {missing!r}{said}"
        check_more(block, done, cwd)


def check_more(block: Block, done: subprocess.CompletedProcess, cwd: Path) -> None:
    """What a shown output cannot say for a block (kept from the README's earlier tests)."""
    if "mpips.train(" in block.code:
        assert 0 < float(done.stdout.split()[-1]) < 0.69, done.stdout   # it learned
    if "mpips.load(" in block.code:
        assert (cwd / "runs" / "clicks" / "summary.json").exists()


def test_every_page_on_disk_has_its_runnable_blocks_parsed():
    """A mark the parser cannot read (a typo) is an error, not a block left unrun."""
    for page in PAGES:
        text = page.read_text()
        marks = len(re.findall(r"^<!-- (?:run|output)\b", text, re.M))
        parsed = blocks(page)
        assert marks == len(parsed) + sum(b.output is not None for b in parsed), page


def test_the_matcher_can_fail():
    shown = "[    0.4s] wrote 2,000 rows\n...\ndone 0.5"
    assert matches(shown, "[   1.2s] wrote 2,000 rows\nx\ndone 0.5\n", False) is None
    assert matches(shown, "[   1.2s] wrote 2,001 rows\ndone 0.5\n", False) is not None
    assert matches(shown, "[   1.2s] wrote 3,001 rows\ndone 0.7\n", True) is None
    assert matches(shown, "[   1.2s] wrote 3,001 rows\ndone 0.7\nmore\n", True) is not None
    assert matches("a\nb", "a\nc\nb\n", False) is not None     # no `...`: all, in order
    assert matches("a\nb", "b\na\n", False) is not None


def test_the_readme_links_to_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"
