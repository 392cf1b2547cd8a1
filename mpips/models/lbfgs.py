"""Full-batch L-BFGS, and OWL-QN for an L1 penalty, over dense tables: the weights, the
gradient, the direction and the m pairs of history live on the servers, and every vector
step (the two-loop recursion, the trial points of the line search, the projections) is an
operation the servers run on their blocks. The driver holds scalars only.

`minimize` knows nothing of the data: `evaluate(point, gradient)` returns the smooth part
of the objective at `point` (a dense table) and leaves its gradient in `gradient`. The
tables are named by `tables(memory, l1)`, so that the ranks helping to evaluate can name
them too.
"""
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

ARMIJO = 1e-4        # sufficient decrease, as a fraction of the step's predicted one
MAX_TRIALS = 40      # halvings of the step before the line search gives up


@dataclass(frozen=True)
class Settings:
    memory: int = 10         # history pairs
    l1: float = 0.0          # > 0: OWL-QN
    max_iter: int = 500
    tol: float = 1e-10       # stop when an iteration lowers the objective by less, relatively


class Step(NamedTuple):
    iteration: int
    seconds: float
    objective: float
    gradient_norm: float     # of the pseudo-gradient with L1
    step: float
    evaluations: int


def tables(memory: int, l1: float) -> list:
    """The names of the tables the solver uses: point and gradient twice (the current one and
    the trial), direction, scratch, history; with L1 the pseudo-gradient and the orthant."""
    names = ["w", "g", "w_trial", "g_trial", "direction", "scratch"]
    names += [f"s{i}" for i in range(memory)] + [f"y{i}" for i in range(memory)]
    return names + (["pseudo_gradient", "orthant"] if l1 > 0 else [])


def minimize(t: dict, evaluate: Callable, settings: Settings,
             report: Callable[[Step], None] = lambda step: None, resume: dict | None = None,
             checkpoint: Callable[[int, dict], None] | None = None, every: int = 0,
             stop: Callable[[], bool] = lambda: False) -> list:
    """Minimize evaluate's function (+ l1 |w|_1) from t["w"] as it is; t: the tables by the
    names `tables` gives. The result is left in t["w"] (t's entries for w and g are swapped
    with the trial's as the solver goes). Returns the Steps.

    With `checkpoint`, every `every` iterations checkpoint(iteration, state) is called, the
    state (plain data) being what `resume` takes to go on from there: the tables must then
    hold what they held when it was called. Once stop() is true, at the end of an iteration,
    it checkpoints there (if it can) and returns."""
    l1, m = settings.l1, settings.memory
    start = time.monotonic()
    by_name = {table.name: table for table in t.values()}
    if resume:
        for role, name in resume["roles"].items():
            t[role] = by_name[name]
        history = [(by_name[s], by_name[y], rho) for s, y, rho in resume["history"]]
        spare = [(by_name[s], by_name[y]) for s, y in resume["spare"]]
        steps = [Step(*step) for step in resume["steps"]]
        f, evaluations, first = resume["objective"], resume["evaluations"], resume["iteration"]
        start -= steps[-1].seconds
    else:
        history = []   # (s, y, rho), oldest first
        spare = [(t[f"s{i}"], t[f"y{i}"]) for i in range(m)]
    w, g, wt, gt = t["w"], t["g"], t["w_trial"], t["g_trial"]
    d, q = t["direction"], t["scratch"]
    if not resume:
        f = _objective(w, g, evaluate, l1, q)
        evaluations, first = 1, 0
        steps = [Step(0, time.monotonic() - start, f, math.nan, 0.0, evaluations)]

    def state(iteration: int) -> dict:
        return {"iteration": iteration, "objective": f, "evaluations": evaluations,
                "roles": {role: t[role].name for role in ("w", "g", "w_trial", "g_trial")},
                "history": [(s.name, y.name, rho) for s, y, rho in history],
                "spare": [(s.name, y.name) for s, y in spare],
                "steps": [list(step) for step in steps]}

    for it in range(first + 1, settings.max_iter + 1):
        descent = g
        if l1 > 0:
            descent = t["pseudo_gradient"].zip("l1_pseudo_gradient", w, g, l1)
        gnorm = descent.nrm2()
        steps[-1] = steps[-1]._replace(gradient_norm=gnorm)
        report(steps[-1])
        if gnorm == 0.0:
            break
        _two_loop(q, descent, history)
        d.copy(q).scale(-1.0)
        if l1 > 0:   # keep to the directions the pseudo-gradient allows, and its orthant
            q.copy(descent).scale(-1.0)
            d.zip("keep_sign", d, q)
            t["orthant"].zip("orthant", w, descent)
        slope = descent.dot(d)
        if slope >= 0:   # no descent along the history's direction: start it afresh
            spare += [(s, y) for s, y, _ in history]
            history.clear()
            d.copy(descent).scale(-1.0)
            slope = -gnorm * gnorm
        step = 1.0 if history else min(1.0, 1.0 / gnorm)
        s_new, y_new = spare.pop(0) if spare else history.pop(0)[:2]
        for _ in range(MAX_TRIALS):
            wt.copy(w).axpy(step, d)
            if l1 > 0:
                wt.zip("keep_sign", wt, t["orthant"])
            ft = _objective(wt, gt, evaluate, l1, q)
            evaluations += 1
            s_new.copy(wt).axpy(-1.0, w)
            predicted = descent.dot(s_new) if l1 > 0 else step * slope
            if ft <= f + ARMIJO * predicted:
                break
            step *= 0.5
        else:
            spare.append((s_new, y_new))
            steps.append(Step(it, time.monotonic() - start, f, gnorm, 0.0, evaluations))
            break   # no decrease along a descent direction: as far as float64 goes
        y_new.copy(gt).axpy(-1.0, g)
        sy = s_new.dot(y_new)
        if sy > 1e-12 * s_new.nrm2() * y_new.nrm2():
            history.append((s_new, y_new, 1.0 / sy))
        else:
            spare.append((s_new, y_new))
        w, wt, g, gt = wt, w, gt, g
        t["w"], t["w_trial"], t["g"], t["g_trial"] = w, wt, g, gt
        decrease = (f - ft) / max(abs(f), abs(ft), 1.0)
        f = ft
        steps.append(Step(it, time.monotonic() - start, f, math.nan, step, evaluations))
        if decrease <= settings.tol:
            break
        asked = stop()
        if checkpoint and ((every and it % every == 0) or asked):
            checkpoint(it, state(it))
        if asked:
            break
    if math.isnan(steps[-1].gradient_norm):
        final = (t["pseudo_gradient"].zip("l1_pseudo_gradient", w, g, l1) if l1 > 0 else g)
        steps[-1] = steps[-1]._replace(gradient_norm=final.nrm2())
        report(steps[-1])
    return steps


def _objective(point, gradient, evaluate, l1: float, scratch) -> float:
    f = evaluate(point, gradient)
    if l1 > 0:
        f += l1 * scratch.map("abs", point).sum()
    return f


def _two_loop(q, descent, history: list) -> None:
    """q = H descent, H the inverse Hessian the history implies (scaled by s'y / y'y)."""
    q.copy(descent)
    alphas = []
    for s, y, rho in reversed(history):
        a = rho * s.dot(q)
        q.axpy(-a, y)
        alphas.append(a)
    if history:
        s, y, rho = history[-1]
        q.scale(1.0 / (rho * y.dot(y)))
    for (s, y, rho), a in zip(history, reversed(alphas)):
        b = rho * y.dot(q)
        q.axpy(a - b, s)
