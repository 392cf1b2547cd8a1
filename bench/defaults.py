"""Defaults alone: held-out logloss of each optimizer after one and five epochs, beside
scikit-learn's optimum and Vowpal Wabbit's one pass, on three datasets.

    python bench/defaults.py [--sets census,dense,builtin] [--skip-old]

Datasets (made once in bench/data/, `mpips make-data`):
  census   30,000 + 15,000 rows, --kind census: 123 one-hot binary features from 14
           correlated categorical fields, like adult/a9a
  dense    20,000 + 10,000 rows, --kind dense: 10 real-valued features of magnitudes 0.5 to 8
  builtin  500,000 + 100,000 rows of 20 hashed features (what `make run` trains)

mpips trains with no --lr and no --batch-size, on 1 server + 1 worker and on 1 server + 3
workers (`make run`'s layout); "old" rows use the earlier defaults (1,000-row minibatches,
rate 40 (sgd, not averaged) or 2 (adagrad, ftrl) / features per row) for comparison. scikit-learn is
LogisticRegression with a weak L2 (1e-8: mean logloss + L2/2 |w|^2, C = 1 / (L2 rows))
on the small sets; on the built-in data, where so weak an L2 overfits its 700,000 keys, the
best held-out of L2 = 1e-4, 3e-5, 1e-5. VW: one pass, --loss_function logistic, otherwise
its defaults (-b 24 on the built-in data). Prints the table; writes
bench/results/defaults.json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "defaults")
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save  # noqa: E402
from workers import mpiexec, run  # noqa: E402

from mpips.models.evaluate import read_rows  # noqa: E402
from mpips.kernels.logistic import mean_logloss  # noqa: E402
from mpips.data.samples import features_per_row  # noqa: E402

SETS = {   # name: make-data arguments
    "census": ["--kind", "census", "--rows", "30000", "--test-rows", "15000"],
    "dense": ["--kind", "dense", "--rows", "20000", "--test-rows", "10000"],
    "builtin": ["--rows", "500000", "--features", str(1 << 20), "--nnz", "20"],
}
OPTIMIZERS = ("sgd", "adagrad", "ftrl", "adam")
OLD_SCALE = {"sgd": 40.0, "adagrad": 2.0, "ftrl": 2.0}


def dataset(name: str) -> str:
    prefix = os.path.join(DATA, name)
    if not os.path.exists(prefix + ".train.svm"):
        run([sys.executable, "-m", "mpips", "make-data", *SETS[name], "--seed", "1", prefix])
    return prefix


def matrices(prefix: str):
    """Train and test rows as scipy CSR matrices over the keys of both, and their labels."""
    import scipy.sparse as sp
    train, test = read_rows(prefix + ".train.svm"), read_rows(prefix + ".test.svm")
    keys = np.unique(np.concatenate([train.indices, test.indices]))

    def matrix(rows):
        return sp.csr_matrix((rows.values.astype(np.float64),
                              np.searchsorted(keys, rows.indices), rows.indptr),
                             shape=(len(rows), keys.shape[0]))
    return matrix(train), train.labels, matrix(test), test.labels


def sklearn_optimum(prefix: str, l2s) -> dict:
    """Held-out logloss of LogisticRegression for each L2 (mean logloss + l2/2 |w|^2)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    x, y, xt, yt = matrices(prefix)
    out = {}
    for l2 in l2s:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = LogisticRegression(C=1 / (l2 * x.shape[0]), max_iter=3000, tol=1e-7)
            model.fit(x, y)
        out[f"{l2:g}"] = float(mean_logloss(model.decision_function(xt), yt))
    return out


def vw_lines(prefix: str, part: str) -> str:
    rows = read_rows(f"{prefix}.{part}.svm")
    lines = []
    for r in range(len(rows)):
        a, b = rows.indptr[r], rows.indptr[r + 1]
        feats = " ".join(f"{k}:{v:.6g}" for k, v in zip(rows.indices[a:b].tolist(),
                                                          rows.values[a:b].tolist()))
        lines.append(f"{1 if rows.labels[r] > 0.5 else -1} |f {feats}")
    return "\n".join(lines) + "\n"


def vw_one_pass(prefix: str, extra: str = "") -> float:
    from vowpalwabbit import Workspace
    with tempfile.TemporaryDirectory() as tmp:
        paths = {p: os.path.join(tmp, p) for p in ("train", "test", "model", "preds")}
        for part in ("train", "test"):
            with open(paths[part], "w") as f:
                f.write(vw_lines(prefix, part))
        vw = Workspace(f"--quiet --loss_function logistic -d {paths['train']} "
                       f"-f {paths['model']} {extra}")
        vw.run_parser()
        vw.finish()
        vw = Workspace(f"--quiet -t -i {paths['model']} --link logistic -d {paths['test']} "
                       f"-p {paths['preds']}")
        vw.run_parser()
        vw.finish()
        p = np.clip(np.loadtxt(paths["preds"]), 1e-15, 1 - 1e-15)
    labels = read_rows(prefix + ".test.svm").labels
    return float(mean_logloss(np.log(p) - np.log1p(-p), labels))


def mpips(prefix: str, optimizer: str, epochs: int, workers: int, old: bool) -> dict:
    out = os.path.join(HERE, "out", "defaults", f"{os.path.basename(prefix)}-{optimizer}-"
                       f"{epochs}-{workers}{'-old' if old else ''}")
    args = []
    if old:
        rate = OLD_SCALE[optimizer] / (features_per_row(prefix + ".train.svm") + 1)
        args = ["--batch-size", "1000", "--lr", repr(rate)]
        if optimizer == "sgd":
            args += ["--average-after", "off"]
    proc_args = [mpiexec(), "-n", str(1 + workers), sys.executable, "-m", "mpips", "train",
                 "--train", prefix + ".train.svm", "--test", prefix + ".test.svm",
                 "--out", out, "--overwrite", "--optimizer", optimizer,
                 "--epochs", str(epochs), *args]
    proc = subprocess.run(proc_args, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:   # a loss that is no longer finite stops the job, saying so
        return {"test_logloss": None, "error": (proc.stdout + proc.stderr)[-300:]}
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    return {"test_logloss": s["test_logloss"], "batch_size": s["config"]["batch_size"],
            "lr": s["config"]["optimizer"]["lr"], "train_s": s["train_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default=",".join(SETS),
                        help="which datasets, comma-separated (default: %(default)s)")
    parser.add_argument("--skip-old", action="store_true", help="no runs with the old defaults")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "defaults.json"))
    args = parser.parse_args()
    names = args.sets.split(",")
    results = {}
    for name in names:
        prefix = dataset(name)
        builtin = name == "builtin"
        ref = {"sklearn": sklearn_optimum(prefix, (1e-4, 3e-5, 1e-5) if builtin else (1e-8,)),
               "vw_one_pass": vw_one_pass(prefix, "-b 24" if builtin else "")}
        ref["sklearn_optimum"] = min(ref["sklearn"].values())
        runs = {}
        for workers in ((3,) if builtin else (1, 3)):
            for optimizer in OPTIMIZERS:
                for old in ((False,) if args.skip_old or optimizer not in OLD_SCALE
                            else (False, True)):
                    key = f"{optimizer} 1+{workers}{' old' if old else ''}"
                    runs[key] = {e: mpips(prefix, optimizer, e, workers, old) for e in (1, 5)}
                    print(f"{name:8} {key:18} " + "  ".join(
                        f"{e} ep {fmt(r['test_logloss'])}" for e, r in runs[key].items()),
                        flush=True)
        results[name] = {"references": ref, "mpips": runs}
    report(results)
    save(args.out, "defaults", datasets={n: SETS[n] for n in names}, results=results)


def fmt(x) -> str:
    return "failed" if x is None else f"{x:.4f}"


def report(results: dict) -> None:
    print("\nheld-out logloss with defaults (no --lr, no --batch-size); in brackets: one epoch "
          "against VW's one pass, five epochs against scikit-learn's optimum")
    for name, r in results.items():
        ref = r["references"]
        print(f"\n{name}: scikit-learn optimum {ref['sklearn_optimum']:.4f}, VW one pass "
              f"{ref['vw_one_pass']:.4f}")
        for key, runs in r["mpips"].items():
            one, five = runs[1]["test_logloss"], runs[5]["test_logloss"]
            gap1 = f"{one / ref['vw_one_pass'] - 1:+.1%}" if one else ""
            gap5 = f"{five / ref['sklearn_optimum'] - 1:+.1%}" if five else ""
            extra = (f"batch {runs[1]['batch_size']}, lr {runs[1]['lr']:.3g}"
                     if runs[1].get("batch_size") else "")
            print(f"  {key:18} 1 epoch {fmt(one):>8} {gap1:>7}   5 epochs {fmt(five):>8} "
                  f"{gap5:>7}   {extra}")


if __name__ == "__main__":
    main()
