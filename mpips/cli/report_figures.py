"""The plots of `mpips report`: what a report shows of one run (`Run`), and each figure
drawn from the runs on a fresh matplotlib figure (None if no run has what it needs), as a
PNG for the page."""
import base64
import io
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Run:
    """What a report shows of one run."""
    path: str
    label: str
    summary: dict
    samples: np.ndarray | None = None     # timeline.SAMPLE rows, or None
    ranks: np.ndarray | None = None       # each sample's rank
    servers: int = 0
    tasks: dict | None = None             # a pipeline's logged tasks (timeline.read_tasks)
    curve: list = field(default_factory=list)   # scored snapshots (evaluate.score_snapshots)
    notes: list = field(default_factory=list)   # what is missing, and why

    def of(self, rank: int) -> np.ndarray:
        assert self.samples is not None, "asked only of a run with a timeline"
        return self.samples[self.ranks == rank]

    @property
    def worker_ranks(self) -> range:
        return range(self.servers, self.summary["servers"] + self.summary["workers"])



# Figures. Each takes the runs and draws on a fresh matplotlib figure; None if no run has
# what it needs.

def _rate(t: np.ndarray, cumulative: np.ndarray) -> tuple:
    """Midpoints and the rate of change of a cumulative figure between samples."""
    dt = np.diff(t)
    keep = dt > 0
    return ((t[1:] + t[:-1])[keep] / 2, (np.diff(cumulative)[keep] / dt[keep]))


def _grid(run: Run, ranks, name: str, points: int = 200) -> tuple:
    """Time grid and the sum over `ranks` of a cumulative figure, interpolated on it."""
    end = max([float(run.of(r)["t"].max()) for r in ranks if run.of(r).shape[0]], default=0.0)
    t = np.linspace(0.0, end, points)
    total = np.zeros(points)
    for r in ranks:
        s = run.of(r)
        if s.shape[0]:
            total += np.interp(t, s["t"], s[name].astype(float), left=0.0)
    return t, total


SECONDS = "seconds of training"


def _axis(ax, ylabel: str, xlabel: str | None = SECONDS, title: str | None = None,
          legend: int = 8, fraction: bool = False) -> None:
    """Labels, a legend (if anything is labelled), and for a fraction of time, 0 to 1."""
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    if title:
        ax.set_title(title, fontsize=9)
    if fraction:
        ax.set_ylim(-0.02, 1.02)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend, ncol=2 if legend < 8 else 1)


def _titled(fig, title: str):
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def fig_learning(runs: list, plt):
    curves = [r for r in runs if r.curve or r.summary.get("test_logloss") is not None]
    if not curves:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex="col")
    for i, run in enumerate(curves):
        c = f"C{i}"
        t = [p["elapsed_s"] for p in run.curve]
        ex = [p["trained_examples"] for p in run.curve]
        ll = [p["logloss"] for p in run.curve]
        auc = [np.nan if p["auc"] is None else p["auc"] for p in run.curve]
        s = run.summary
        final_t, final_ex = s["train_s"], s["train_examples"]
        for row, (values, final) in enumerate(((ll, s.get("test_logloss")),
                                               (auc, s.get("test_auc")))):
            axes[row, 0].plot(t, values, "o-", color=c, ms=3, label=None if row else run.label)
            if None not in ex:
                axes[row, 1].plot(ex, values, "o-", color=c, ms=3)
            if final is not None:   # the model the job saved and scored itself
                axes[row, 0].plot([final_t], [final], "*", color=c, ms=11)
                axes[row, 1].plot([final_ex], [final], "*", color=c, ms=11)
    _axis(axes[0, 0], "held-out logloss", None)
    _axis(axes[1, 0], "held-out AUC")
    axes[1, 1].set_xlabel("examples trained")
    return _titled(fig, "Learning curves (dots: snapshots; star: the final model, as the job "
                        "scored it)")


def fig_throughput(runs: list, plt):
    timed = [r for r in runs if r.samples is not None and not r.summary.get("solver")]
    if not timed:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for i, run in enumerate(timed):
        t, examples = _grid(run, run.worker_ranks, "examples", 60)
        _, loss = _grid(run, run.worker_ranks, "train_loss", 60)
        mid, trained, lost = (t[1:] + t[:-1]) / 2, np.diff(examples), np.diff(loss)
        top.plot(mid, trained / np.diff(t) / 1e3, color=f"C{i}", label=run.label)
        seen = trained > 0
        bottom.plot(mid[seen], lost[seen] / trained[seen], color=f"C{i}")
    _axis(top, "thousand examples / s", None)
    _axis(bottom, "training logloss (recent)")
    return _titled(fig, "Throughput of all workers together, and the training loss as it went")


def fig_workers(runs: list, plt):
    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 3.2 * len(runs)), squeeze=False)
    for (waiting, bars), run in zip(axes, runs):
        s = run.summary
        x = np.arange(s["workers"])
        bars.bar(x - 0.2, s["wait_s"], 0.4, label="blocked on pulls")
        bars.bar(x + 0.2, s["held_s"][:x.shape[0]], 0.4, label="of which held for the clocks")
        bars.set_xticks(x)
        _axis(bars, "seconds", "worker", f"{run.label}: whole run")
        if run.samples is not None:
            for w, rank in enumerate(run.worker_ranks):
                mine = run.of(rank)
                if mine.shape[0] > 1:
                    mid, frac = _rate(mine["t"], mine["wait_s"])
                    waiting.plot(mid, np.clip(frac, 0, 1), label=f"worker {w}")
        _axis(waiting, "fraction of time waiting", title=f"{run.label}: over time", legend=7,
              fraction=True)
    return _titled(fig, "Each worker's waiting: blocked on its pulls (round trips, and pulls "
                        "the servers held for the clocks)")


def fig_clocks(runs: list, plt):
    timed = [r for r in runs if r.samples is not None and r.servers]
    if not timed:
        return None
    fig, (gap, clock) = plt.subplots(1, 2, figsize=(11, 3.6))
    for i, run in enumerate(timed):
        servers = run.samples[run.ranks < run.servers]
        order = np.argsort(servers["t"], kind="stable")
        gap.step(servers["t"][order], servers["gap"][order], where="post", color=f"C{i}",
                 label=f"{run.label} ({run.summary['consistency']})")
        lead = run.of(0)
        live = lead["clock"] >= 0
        clock.plot(lead["t"][live], lead["clock"][live], color=f"C{i}")
    _axis(gap, "clock gap (fastest - slowest)")
    _axis(clock, "slowest worker's clock")
    return _titled(fig, "Clocks: how far apart the workers were (BSP keeps the gap at most 1)")


def fig_servers(runs: list, plt):
    timed = [r for r in runs if r.samples is not None and r.servers]
    if not timed:
        return None
    fig, axes = plt.subplots(len(timed), 2, figsize=(11, 3.2 * len(timed)), squeeze=False)
    for (busy, sent), run in zip(axes, timed):
        for rank in range(run.summary["servers"] + run.summary["workers"]):
            mine = run.of(rank)
            if mine.shape[0] < 2:
                continue
            server = rank < run.servers
            name = f"server {rank}" if server else f"worker {rank - run.servers}"
            mid, rate = _rate(mine["t"], mine["bytes_sent"])
            sent.plot(mid, rate / 2**20, label=name, lw=1.2 if server else 0.8,
                      ls="-" if server else "--")
            if server:
                mid, frac = _rate(mine["t"], mine["busy_s"])
                busy.plot(mid, np.clip(frac, 0, 1), label=name)
        _axis(busy, "fraction of time busy", title=f"{run.label}: server load", legend=7,
              fraction=True)
        _axis(sent, "MiB / s sent", title=f"{run.label}: bytes sent by each rank", legend=7)
    return _titled(fig, "Servers: time spent handling requests, and traffic")


def fig_solver(runs: list, plt):
    solved = [r for r in runs if r.summary.get("solver")]
    if not solved:
        return None
    fig, ax = plt.subplots(figsize=(11, 3.8))
    for i, run in enumerate(solved):
        steps = run.summary["solver"]["steps"]
        ax.plot([s["seconds"] for s in steps], [s["objective"] for s in steps], "o-", ms=2,
                color=f"C{i}", label=run.label)
    ax.set_yscale("log")
    _axis(ax, "objective", "seconds")
    return _titled(fig, "Full-batch solver: the objective against time")


def fig_pipeline(runs: list, plt):
    piped = [r for r in runs if r.tasks is not None and len(r.tasks["clock"])]
    if not piped:
        return None
    fig, axes = plt.subplots(len(piped), 1, figsize=(11, 1.4 + 1.6 * len(piped)),
                             squeeze=False)
    colors = {b"F": "C0", b"B": "C1", b"U": "C2"}
    for ax, run in zip(axes[:, 0], piped):
        t, stages = run.tasks, int(run.summary["config"].get("stages", 1))
        first = t["worker"] < stages   # the first copy of the pipeline
        clock = t["clock"][first].max()
        step = np.flatnonzero(first & (t["clock"] == clock))
        origin = t["start"][step].min()
        for i in step:
            a, b = (t["start"][i] - origin) * 1e3, (t["end"][i] - origin) * 1e3
            ax.barh(t["stage"][i], b - a, left=a, color=colors.get(bytes(t["kind"][i]), "C7"),
                    edgecolor="white", height=0.7)
            if t["kind"][i] != b"U":
                ax.text((a + b) / 2, t["stage"][i], str(t["micro"][i]), ha="center",
                        va="center", fontsize=7, color="white")
        span = (t["end"][step].max() - origin) * stages
        idle = 1 - (t["end"][step] - t["start"][step]).sum() / span if span > 0 else 0.0
        ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
        ax.invert_yaxis()
        _axis(ax, "", "milliseconds", title=f"{run.label}: clock {clock} of the first "
              f"pipeline, {run.summary['config'].get('pipeline')} (idle {idle:.0%}; "
              f"blue forward, orange backward, green the update; numbers: micro-batches)")
    return _titled(fig, "Pipeline: each stage's tasks in one minibatch")


FIGURES = [("Learning curves", fig_learning), ("Throughput", fig_throughput),
           ("Pipeline", fig_pipeline), ("Full-batch solver", fig_solver), ("Workers", fig_workers),
           ("Clocks", fig_clocks), ("Servers", fig_servers)]


def png(fig, plt) -> str:
    """The figure as a base64 PNG (the figure closed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()
