"""Full-batch L-BFGS, and OWL-QN for an L1 penalty, over dense tables: the weights, the
gradient, the direction and the m pairs of history live on the servers, and every vector
step (the trial points of the line search, the projections) is an operation the servers run
on their blocks. The driver holds scalars only.

The two-loop recursion runs on scalars, vector-free (Chen, Wang and Zhou, "Large-scale
L-BFGS using MapReduce", NIPS 2014): the direction is a combination of the basis (the
history's s and y, and the gradient), whose coefficients follow from the basis's dot
products. The servers give the dot products of the vectors new at each iteration in one
request (`gram`, the others are kept) and make the direction in one more (`combine`): a
handful of requests an iteration instead of some 4m + 20.

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

import numpy as np

ARMIJO = 1e-4        # sufficient decrease, as a fraction of the step's predicted one
MAX_TRIALS = 40      # trial steps before the line search gives up


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
    solver = _Solver(t, evaluate, settings.l1, report, time.monotonic())
    if resume:
        progress = _Progress.restore(resume, t)
        solver.start -= progress.steps[-1].seconds
    else:
        progress = solver.begin(settings.memory)
    for it in range(progress.iteration + 1, settings.max_iter + 1):
        decrease = solver.iterate(progress, it)
        if decrease is None or decrease <= settings.tol:
            break
        asked = stop()
        if checkpoint and ((every and it % every == 0) or asked):
            checkpoint(it, progress.plain(t))
        if asked:
            break
    solver.finish(progress)
    return progress.steps


class _Pair(NamedTuple):
    """One pair of the history: a step, the change of gradient along it, 1 / s'y."""
    s: object
    y: object
    rho: float


class _Trial(NamedTuple):
    """The point the line search accepted: its objective, and the step that reached it."""
    objective: float
    step: float


@dataclass
class _Progress:
    """The solver between iterations (which table plays w, which the trial, is in t). Its
    plain form is what a checkpoint keeps and `resume` takes."""
    iteration: int
    objective: float
    evaluations: int
    history: list      # _Pair, oldest first
    spare: list        # (s, y): the tables for pairs not in the history
    steps: list        # Step

    def plain(self, t: dict) -> dict:
        return {"iteration": self.iteration, "objective": self.objective,
                "evaluations": self.evaluations,
                "roles": {role: t[role].name for role in ("w", "g", "w_trial", "g_trial")},
                "history": [(s.name, y.name, rho) for s, y, rho in self.history],
                "spare": [(s.name, y.name) for s, y in self.spare],
                "steps": [list(step) for step in self.steps]}

    @classmethod
    def restore(cls, state: dict, t: dict) -> "_Progress":
        """From a plain form, giving t's roles back to the tables that held them."""
        by_name = {table.name: table for table in t.values()}
        for role, name in state["roles"].items():
            t[role] = by_name[name]
        return cls(iteration=state["iteration"], objective=state["objective"],
                   evaluations=state["evaluations"],
                   history=[_Pair(by_name[s], by_name[y], rho) for s, y, rho in state["history"]],
                   spare=[(by_name[s], by_name[y]) for s, y in state["spare"]],
                   steps=[Step(*step) for step in state["steps"]])


class _Solver:
    """The steps of an iteration, on the tables t (by the names `tables` gives)."""

    def __init__(self, t: dict, evaluate: Callable, l1: float, report: Callable,
                 start: float):
        self.t, self.evaluate, self.l1, self.report = t, evaluate, l1, report
        self.start = start   # time.monotonic() when the solver (as resumed) began
        self.dots = _Dots()

    def seconds(self) -> float:
        return time.monotonic() - self.start

    def objective(self, point, gradient) -> float:
        """The objective at `point` (with the L1 term), its smooth part's gradient left in
        `gradient`."""
        f = self.evaluate(point, gradient)
        self.dots.forget(gradient)
        if self.l1 > 0:
            f += self.l1 * self.t["scratch"].map("abs", point).sum()
        return f

    def difference(self, out, a, b):
        """out = a - b (its dot products forgotten); returns out."""
        out.combine([1.0, -1.0], [a, b])
        self.dots.forget(out)
        return out

    def descent(self):
        """The gradient at w; with L1 the pseudo-gradient."""
        t = self.t
        if self.l1 > 0:
            self.dots.forget(t["pseudo_gradient"])
            return t["pseudo_gradient"].zip("l1_pseudo_gradient", t["w"], t["g"], self.l1)
        return t["g"]

    def begin(self, memory: int) -> _Progress:
        """Progress at iteration 0: the objective at w as it is, every pair spare."""
        t = self.t
        spare = [(t[f"s{i}"], t[f"y{i}"]) for i in range(memory)]
        f = self.objective(t["w"], t["g"])
        return _Progress(iteration=0, objective=f, evaluations=1, history=[], spare=spare,
                         steps=[Step(0, self.seconds(), f, math.nan, 0.0, 1)])

    def iterate(self, p: _Progress, it: int) -> float | None:
        """Iteration `it`: reports the last step with its gradient norm, then moves w to a
        point of lower objective. Returns the relative decrease of the objective, or None
        where the solver ends (a zero gradient, or no decrease along a descent direction)."""
        descent = self.descent()
        basis = [pair.s for pair in p.history] + [pair.y for pair in p.history] + [descent]
        gram = self.dots.matrix(basis)
        gnorm = math.sqrt(gram[-1, -1])
        p.steps[-1] = p.steps[-1]._replace(gradient_norm=gnorm)
        self.report(p.steps[-1])
        if gnorm == 0.0:
            return None
        slope = self.direction(p, descent, gnorm, basis, gram)
        step = 1.0 if p.history else min(1.0, 1.0 / gnorm)
        if p.spare:
            s_new, y_new = p.spare.pop(0)
        else:
            oldest = p.history.pop(0)
            s_new, y_new = oldest.s, oldest.y
        trial = self.line_search(p, descent, slope, step, s_new)
        if trial is None:   # as far as float64 goes
            p.spare.append((s_new, y_new))
            p.steps.append(Step(it, self.seconds(), p.objective, gnorm, 0.0, p.evaluations))
            return None
        return self.accept(p, it, trial, s_new, y_new)

    def direction(self, p: _Progress, descent, gnorm: float, basis: list,
                  gram: np.ndarray) -> float:
        """Sets t["direction"] to minus the history's inverse Hessian times `descent` (with
        L1, kept to the directions the pseudo-gradient allows, and sets its orthant); returns
        the slope along it. Where that is no descent, the history is dropped and the
        direction is minus `descent`. `basis`: the history's s, its y, then `descent`;
        `gram`: their dot products."""
        t, d = self.t, self.t["direction"]
        delta = two_loop(gram, [pair.rho for pair in p.history])
        d.combine((-delta).tolist(), basis)
        if self.l1 > 0:
            q = t["scratch"].combine([-1.0], [descent])
            d.zip("keep_sign", d, q)
            t["orthant"].zip("orthant", t["w"], descent)
            slope = descent.dot(d)
        else:
            slope = -float(gram[-1] @ delta)
        if slope >= 0:
            p.spare += [(s, y) for s, y, _ in p.history]
            p.history.clear()
            d.combine([-1.0], [descent])
            slope = -gnorm * gnorm
        return slope

    def line_search(self, p: _Progress, descent, slope: float, step: float,
                    s_new) -> _Trial | None:
        """Backtracking from `step` along the direction until the decrease is sufficient
        (Armijo): then w_trial and g_trial hold the point and its gradient, s_new the move
        from w. A step refused shrinks to the minimum of the quadratic through the objective
        and slope at w and the objective there, kept within 0.1-0.5 of it (Nocedal and
        Wright, 3.5); with L1 it halves. None after MAX_TRIALS."""
        t = self.t
        w, wt, gt, d = t["w"], t["w_trial"], t["g_trial"], t["direction"]
        for _ in range(MAX_TRIALS):
            wt.combine([1.0, step], [w, d])
            if self.l1 > 0:
                wt.zip("keep_sign", wt, t["orthant"])
            ft = self.objective(wt, gt)
            p.evaluations += 1
            # With L1 the projection moved the point: the step's decrease is asked.
            predicted = (descent.dot(self.difference(s_new, wt, w)) if self.l1 > 0
                         else step * slope)
            if ft <= p.objective + ARMIJO * predicted:
                if self.l1 == 0:
                    self.difference(s_new, wt, w)
                return _Trial(ft, step)
            curve = ft - p.objective - step * slope   # > 0 where the quadratic has a minimum
            if self.l1 > 0 or not (math.isfinite(ft) and curve > 0):
                step *= 0.5
            else:
                step = min(max(-slope * step * step / (2.0 * curve), 0.1 * step), 0.5 * step)
        return None

    def accept(self, p: _Progress, it: int, trial: _Trial, s_new, y_new) -> float:
        """Moves to the trial point: the pair (s_new, y_new) joins the history if its
        curvature is positive, the trial's tables become w and g. Returns the relative
        decrease of the objective."""
        t = self.t
        self.difference(y_new, t["g_trial"], t["g"])
        # The dot products the next iteration's basis adds, asked for with these (one
        # request): the new pair's, and (without L1) the new gradient's.
        new = [s_new, y_new] + ([] if self.l1 > 0 else [t["g_trial"]])
        kept = [table for pair in p.history for table in pair[:2]]
        self.dots.fetch(new, kept + new)
        sy, ss, yy = (self.dots.get(s_new, y_new), self.dots.get(s_new, s_new),
                      self.dots.get(y_new, y_new))
        if sy > 1e-12 * math.sqrt(ss) * math.sqrt(yy):
            p.history.append(_Pair(s_new, y_new, 1.0 / sy))
        else:
            p.spare.append((s_new, y_new))
        t["w"], t["w_trial"], t["g"], t["g_trial"] = t["w_trial"], t["w"], t["g_trial"], t["g"]
        f, ft = p.objective, trial.objective
        decrease = (f - ft) / max(abs(f), abs(ft), 1.0)
        p.iteration, p.objective = it, ft
        p.steps.append(Step(it, self.seconds(), ft, math.nan, trial.step, p.evaluations))
        return decrease

    def finish(self, p: _Progress) -> None:
        """Gives the last step its gradient norm, if it has none yet, and reports it."""
        if math.isnan(p.steps[-1].gradient_norm):
            p.steps[-1] = p.steps[-1]._replace(gradient_norm=self.descent().nrm2())
            self.report(p.steps[-1])


def two_loop(gram: np.ndarray, rhos: list) -> np.ndarray:
    """The coefficients c of H q = sum c_j b_j, the two-loop recursion on scalars: b is the
    basis (the k pairs' s, oldest first, their y, then q), `gram` its dot products, `rhos`
    the pairs' 1 / s'y; H the inverse Hessian the history implies (scaled by s'y / y'y of
    the newest pair). Pure."""
    k = len(rhos)
    c = np.zeros(2 * k + 1)
    c[2 * k] = 1.0
    alphas = [0.0] * k
    for i in reversed(range(k)):
        alphas[i] = a = rhos[i] * float(gram[i] @ c)        # s_i . q
        c[k + i] -= a
    if k:
        c *= 1.0 / (rhos[-1] * gram[2 * k - 1, 2 * k - 1])   # s'y / y'y
    for i in range(k):
        b = rhos[i] * float(gram[k + i] @ c)               # y_i . q
        c[i] += alphas[i] - b
    return c


class _Dots:
    """The dot products of tables known to the driver, asked of the servers only for tables
    new since (a table written is forgotten)."""

    def __init__(self):
        self._known: dict = {}   # (name, name), both orders -> the dot product

    def forget(self, table) -> None:
        self._known = {k: v for k, v in self._known.items() if table.name not in k}

    def get(self, a, b) -> float:
        return self._known[(a.name, b.name)]

    def fetch(self, rows: list, columns: list) -> None:
        """Ask for the dot products of `rows` with `columns` (one request)."""
        values = rows[0].client.gram(rows, columns)
        for i, a in enumerate(rows):
            for j, b in enumerate(columns):
                self._known[(a.name, b.name)] = self._known[(b.name, a.name)] = values[i, j]

    def matrix(self, tables: list) -> np.ndarray:
        """The dot products of `tables` with each other (those not known: one request)."""
        names = [t.name for t in tables]
        missing = [t for t in tables if any((t.name, n) not in self._known for n in names)]
        if missing:
            self.fetch(missing, tables)
        return np.array([[self._known[(a, b)] for b in names] for a in names])
