"""Pipeline schedules as data: for S stages and M micro-batches, the order in which each stage
runs its tasks. No MPI here; a pipeline's ranks run these lists, tests check them, and
`simulate` shows where the time goes.

A task is forward or backward of one micro-batch on one stage, or the update of a stage's
weights after all its backwards. The task DAG: F(s, m) needs F(s-1, m); B(s, m) needs F(s, m)
and B(s+1, m) (the last stage's backward follows its own forward: the loss is there);
U(s) needs every B(s, m). A policy chooses each stage's order; any order that respects
the DAG gives the same weights, since a stage adds its micro-batches' gradients in
micro-batch order whatever the schedule (see the pipeline's accumulation).

  gpipe      fill-drain (GPipe): every forward, then every backward. A stage holds the
             activations of all M micro-batches at once.
  1f1b       one-forward-one-backward (PipeDream-Flush): stage s runs S - s forwards to fill
             the pipe, then alternates one backward and one forward, then drains. A stage
             holds at most S - s micro-batches' activations; the bubble is the same.
"""
from dataclasses import dataclass

import numpy as np

FORWARD, BACKWARD, UPDATE = "F", "B", "U"


@dataclass(frozen=True, order=True)
class Task:
    stage: int
    kind: str       # FORWARD, BACKWARD or UPDATE
    micro: int = -1   # -1 for UPDATE

    def __str__(self) -> str:
        return f"{self.kind}{self.micro}" if self.kind != UPDATE else "U"


def needs(task: Task, stages: int, micros: int) -> list:
    """The tasks `task` waits for (on its own stage or a neighbour)."""
    s, m = task.stage, task.micro
    if task.kind == FORWARD:
        return [Task(s - 1, FORWARD, m)] if s > 0 else []
    if task.kind == BACKWARD:
        after = [Task(s, FORWARD, m)]
        return after + ([Task(s + 1, BACKWARD, m)] if s < stages - 1 else [])
    return [Task(s, BACKWARD, k) for k in range(micros)]


def gpipe(stages: int, micros: int) -> list:
    """Each stage's tasks in order: all forwards, all backwards, the update."""
    _check(stages, micros)
    return [[Task(s, FORWARD, m) for m in range(micros)] +
            [Task(s, BACKWARD, m) for m in range(micros)] + [Task(s, UPDATE)]
            for s in range(stages)]


def one_f_one_b(stages: int, micros: int) -> list:
    """Each stage's tasks in order: S - s forwards (at most M), then one backward and one
    forward in turn, then the remaining backwards, the update."""
    _check(stages, micros)
    out = []
    for s in range(stages):
        warm = min(stages - s, micros)
        order = [Task(s, FORWARD, m) for m in range(warm)]
        for m in range(micros - warm):
            order += [Task(s, BACKWARD, m), Task(s, FORWARD, warm + m)]
        order += [Task(s, BACKWARD, m) for m in range(micros - warm, micros)]
        out.append([*order, Task(s, UPDATE)])
    return out


POLICIES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def _check(stages: int, micros: int) -> None:
    if stages < 1 or micros < 1:
        raise ValueError(f"a pipeline needs at least one stage and one micro-batch, got "
                         f"{stages} stage(s) and {micros} micro-batch(es)")


def simulate(schedule: list, cost=lambda task: 0.0 if task.kind == UPDATE else 1.0) -> dict:
    """Run the schedule on ideal ranks (each stage runs its list in order, a task starts
    once the tasks it needs have ended, messages take no time): each task's (start, end).
    ValueError naming the stuck tasks if the orders and the DAG deadlock, or if a stage's
    list is not exactly its tasks."""
    stages, micros = len(schedule), sum(t.kind == FORWARD for t in schedule[0])
    for s, order in enumerate(schedule):
        expected = ({Task(s, k, m) for k in (FORWARD, BACKWARD) for m in range(micros)} |
                    {Task(s, UPDATE)})
        if len(order) != len(expected) or set(order) != expected:
            raise ValueError(f"stage {s}: its list is not each of its tasks once")
    times: dict[Task, tuple[float, float]] = {}
    nxt, clock = [0] * stages, [0.0] * stages
    while len(times) < sum(map(len, schedule)):
        moved = False
        for s, order in enumerate(schedule):
            if nxt[s] == len(order):
                continue
            task = order[nxt[s]]
            before = needs(task, stages, micros)
            if all(t in times for t in before):
                start = max([clock[s]] + [times[t][1] for t in before])
                times[task] = (start, start + cost(task))
                clock[s] = times[task][1]
                nxt[s] += 1
                moved = True
        if not moved:
            stuck = [str(order[nxt[s]]) + f"@{s}" for s, order in enumerate(schedule)
                     if nxt[s] < len(order)]
            raise ValueError(f"the schedule deadlocks: waiting {', '.join(stuck)}")
    return times


def bubble(times: dict, stages: int) -> float:
    """The fraction of stage-time idle between the first task and the last."""
    end = max(e for _, e in times.values())
    busy = sum(e - s for s, e in times.values())
    return 1.0 - busy / (stages * end) if end > 0 else 0.0


def logged_bubbles(worker, clock, start, end, stages: int) -> list:
    """The bubble of each logged step of a pipeline run: for every copy of the pipeline
    (workers copy*S .. copy*S+S-1) and clock, the fraction of its stages' time idle between
    its first task's start and its last task's end."""
    copy = np.asarray(worker) // stages
    out = []
    for c, k in sorted(set(zip(copy.tolist(), np.asarray(clock).tolist()))):
        mine = (copy == c) & (np.asarray(clock) == k)
        span = end[mine].max() - start[mine].min()
        out.append(1.0 - (end[mine] - start[mine]).sum() / (stages * span) if span > 0 else 0.0)
    return out


def peak_in_flight(schedule: list) -> list:
    """Per stage: the most micro-batches forwarded and not yet backwarded (activations held)."""
    peaks = []
    for order in schedule:
        held = peak = 0
        for task in order:
            held += {FORWARD: 1, BACKWARD: -1}.get(task.kind, 0)
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def theoretical_bubble(stages: int, micros: int) -> float:
    """(S-1)/(M+S-1): the idle fraction of a fill-drain or 1F1B pipeline of equal stages."""
    return (stages - 1) / (micros + stages - 1)


def describe(schedule: list) -> str:
    """Each stage's tasks, then the bubble on ideal ranks (a backward twice a forward)
    beside the theory's, and the activations each stage holds at most: what `mpips
    schedule` and `train --print-schedule` print."""
    stages, micros = len(schedule), sum(t.kind == FORWARD for t in schedule[0])
    times = simulate(schedule, lambda t: {FORWARD: 1.0, BACKWARD: 2.0}.get(t.kind, 0.0))
    return (f"{render(schedule)}\nbubble {bubble(times, stages):.1%} of stage time (theory "
            f"{theoretical_bubble(stages, micros):.1%}); activations held at most, in "
            f"micro-batches: {', '.join(map(str, peak_in_flight(schedule)))}")


def render(schedule: list) -> str:
    """One line per stage, its tasks in order (what --print-schedule shows)."""
    width = max(len(str(t)) for order in schedule for t in order)
    return "\n".join(f"stage {s}: " + " ".join(str(t).rjust(width) for t in order)
                     for s, order in enumerate(schedule))
