"""`mpips report RUN_DIR [RUN_DIR...]`: one HTML page of plots of how runs went, side by side.

Reads what a run leaves in RUN_DIR: summary.json (the totals), timeline.h5 (each rank's
figures over time) and snapshots/ (the model every --snapshot-every seconds, scored here on
the run's test file). The plots are PNGs inside the page (data: URIs), so the one file can be
mailed or copied off the cluster. In one process; no MPI."""
import html
import json
import logging
import os
from collections.abc import Sequence

from ..base import timeline
from ..base.errors import InputError, MpipsError
from .report_figures import FIGURES, Run, png

log = logging.getLogger("mpips")


def load_run(path: str, test: str | None = None) -> Run:
    """A run's summary (InputError if there is none to read), its timeline and its learning
    curve (each left out, with a note saying why, where it cannot be had)."""
    summary_path = os.path.join(path, "summary.json")
    try:
        with open(summary_path) as f:
            summary = json.load(f)
        summary["servers"], summary["workers"], summary["config"]
    except FileNotFoundError:
        raise InputError(f"{path}: no summary.json (not the --out directory of a finished "
                         f"mpips run)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{summary_path}: not a summary written by mpips ({e})") from None
    run = Run(path, _label(path, summary), summary)
    try:
        run.samples, run.ranks, run.servers = timeline.read(path)
    except InputError as e:
        run.notes.append(f"no plots over time: {e}")
    else:
        try:
            run.tasks = timeline.read_tasks(path)
        except InputError as e:
            run.notes.append(f"no plot of the pipeline's tasks: {e}")
    test = test or summary["config"].get("test")
    if not os.path.isdir(os.path.join(path, "snapshots")):
        run.notes.append("no learning curve: the run had no --snapshot-every")
    elif not test:
        run.notes.append("no learning curve: the run had no --test file (give report --test)")
    else:
        run.curve = _score(path, test, run.notes)
        if run.curve and summary["config"].get("tensorboard"):   # beside the live curves
            from ..job.livecurves import write_snapshots
            write_snapshots(summary["config"]["tensorboard"], run.curve,
                            str(summary.get("run_id", "run")))
    return run


def _label(path: str, summary: dict) -> str:
    return os.path.basename(os.path.abspath(path))


def _distinct_labels(runs: list) -> None:
    """Runs of the same directory name are told apart by their run ids."""
    names = [r.label for r in runs]
    for r in runs:
        if names.count(r.label) > 1:
            r.label = f"{r.label} ({r.summary.get('run_id', r.path)})"


def _score(path: str, test: str, notes: list) -> list:
    from ..models.evaluate import read_rows, score_snapshots
    try:
        rows = read_rows(test)
    except (OSError, ValueError, MpipsError) as e:
        notes.append(f"no learning curve: {test}: {e}")
        return []
    curve = score_snapshots(path, rows, notes, test=test)
    if not curve:
        notes.append("no learning curve: no complete snapshot in snapshots/")
    return curve


# The page.

ROWS = [("test logloss", "test_logloss", "{:.4f}"), ("test AUC", "test_auc", "{:.4f}"),
        ("examples trained", "train_examples", "{:,}"),
        ("examples / s", "examples_per_s", "{:,.0f}"), ("training s", "train_s", "{:.1f}"),
        ("wall s", "wall_s", "{:.1f}"), ("servers", "servers", "{}"),
        ("workers", "workers", "{}"), ("consistency", "consistency", "{}"),
        ("keys", "keys_stored", "{:,}"), ("bytes sent / example", "bytes_per_example",
                                          "{:,.0f}"),
        ("max clock gap", "max_clock_gap", "{}"), ("status", "status", "{}")]
CONFIG = [("--model", lambda c: c.get("model")),
          ("--optimizer", lambda c: (c.get("optimizer") or {}).get("name")),
          ("learning rate", lambda c: (c.get("optimizer") or {}).get("lr")),
          ("--batch-size", lambda c: c.get("batch_size")), ("--epochs", lambda c: c.get("epochs")),
          ("--replicas", lambda c: c.get("replicas")), ("--solver", lambda c: c.get("solver")),
          ("--train", lambda c: c.get("train"))]


def _cell(value, fmt: str) -> str:
    if value is None:
        return "–"
    try:
        return html.escape(fmt.format(value))
    except (ValueError, TypeError):
        return html.escape(str(value))


def _table(runs: list) -> str:
    head = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
    body = []
    for name, key, fmt in ROWS:
        body.append(f"<tr><th>{name}</th>" +
                    "".join(f"<td>{_cell(r.summary.get(key), fmt)}</td>" for r in runs) +
                    "</tr>")
    body.append("<tr><th>failures</th>" + "".join(
        f"<td>{len(r.summary.get('failures') or [])}</td>" for r in runs) + "</tr>")
    for name, get in CONFIG:
        body.append(f"<tr><th>{name}</th>" + "".join(
            f"<td>{_cell(get(r.summary['config']), '{:.4g}' if name == 'learning rate' else '{}')}"
            f"</td>" for r in runs) + "</tr>")
    return f"<table><tr><th></th>{head}</tr>{''.join(body)}</table>"


STYLE = """body{font-family:sans-serif;max-width:1040px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right}th{background:#f4f4f4}img{max-width:100%;display:block;margin:1em 0}
.note{color:#a55;font-size:14px}"""
# Counts the images the browser could show, for the test that opens the page.
CHECK = """<script>window.addEventListener("load",function(){var i=document.images,n=0;
for(var k=0;k<i.length;k++){if(i[k].complete&&i[k].naturalWidth>0)n++;}
document.body.setAttribute("data-images-loaded",n+"/"+i.length);});</script>"""


def page(runs: list, left_out: Sequence[str] = ()) -> str:
    """The page of `runs`, with a note for each run `left_out`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = [f"<h1>mpips report: {html.escape(', '.join(r.label for r in runs))}</h1>",
             _table(runs)]
    parts += [f"<p class=note>{html.escape(note)}</p>" for note in left_out]
    for r in runs:
        for note in r.notes:
            parts.append(f"<p class=note>{html.escape(r.label)}: {html.escape(note)}</p>")
    for title, draw in FIGURES:
        fig = draw(runs, plt)
        if fig is not None:
            parts.append(f"<h2>{title}</h2><img alt=\"{title}\" "
                         f"src=\"data:image/png;base64,{png(fig, plt)}\">")
    return (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>mpips report</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}{CHECK}</body></html>\n")


def load_runs(run_dirs: list, test: str | None, left_out: list) -> list:
    """The runs of `run_dirs` that can be reported (see load_run); a run that cannot (one
    that crashed before its summary) is left out with a note in `left_out`, unless no run
    can be: InputError naming the first."""
    runs, errors = [], []
    for d in run_dirs:
        try:
            runs.append(load_run(d, test))
        except InputError as e:
            errors.append(e)
            left_out.append(f"left out: {e}")
    if not runs:
        raise errors[0]
    return runs


def report(run_dirs: list, out: str | None = None, test: str | None = None) -> str:
    """Write the page for `run_dirs` to `out` (by default RUN_DIR/report.html for one run,
    ./report.html for several); its path."""
    from ..base.files import write_bytes
    left_out: list[str] = []
    runs = load_runs(run_dirs, test, left_out)
    _distinct_labels(runs)
    for note in left_out:
        log.warning("%s", note)
    for r in runs:
        for note in r.notes:
            log.warning("%s: %s", r.path, note)
    out = out or (os.path.join(run_dirs[0], "report.html") if len(run_dirs) == 1
                  else "report.html")
    write_bytes(out, page(runs, left_out).encode())
    return out
