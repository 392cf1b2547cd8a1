"""A pipeline schedule played in one process: each schedule's tasks run in an order its
dependencies allow. The reference for the ranks that run stages over MPI, and what the
tests compare with a whole-batch numpy step."""
import numpy as np

from .schedule import BACKWARD, FORWARD, UPDATE, Task, simulate


def run_step(stages: list, schedule: list, x: np.ndarray, labels: np.ndarray,
             lr: float) -> float:
    """One training step of the pipeline in one process: the micro-batches (x cut in
    len(schedule[0]) // 2 equal parts, in order) through the schedule's tasks in an order
    the DAG allows. The step's summed loss."""
    micros = stages[0].micros
    stages[-1].loss = 0.0
    parts = np.array_split(np.arange(x.shape[0]), micros)
    times = simulate(schedule)
    outputs: dict[Task, np.ndarray] = {}
    grads: dict[Task, np.ndarray] = {}
    for task in sorted(times, key=lambda t: (times[t][0], t.stage)):
        s, m = task.stage, task.micro
        if task.kind == FORWARD:
            given = x[parts[m]] if s == 0 else outputs.pop(Task(s - 1, FORWARD, m))
            out = stages[s].forward(m, given, labels[parts[m]])
            if not stages[s].last:
                outputs[task] = out
        elif task.kind == BACKWARD:
            dout = None if stages[s].last else grads.pop(Task(s + 1, BACKWARD, m))
            grads[task] = stages[s].backward(m, dout)
        elif task.kind == UPDATE:
            stages[s].update(lr, x.shape[0])
    return stages[-1].loss
