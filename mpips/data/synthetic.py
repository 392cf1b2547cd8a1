"""Synthetic data with labels drawn from a planted logistic model, of three kinds:

  ctr     hashed categorical features with Zipf-skewed frequencies and a few numeric ones
          (CTR-like, millions of keys; the built-in dataset); with --interactions R, each
          pair of a row's features also adds the dot product of their planted latent
          vectors of R values (what factorization machines model and LR cannot)
  census  like the adult/a9a census data: 14 categorical fields one-hot encoded into 123
          binary features, each field with a frequent value, values correlated through two
          hidden factors (so X^T X has a large top eigenvalue), about 24% positives
  dense   10 real-valued features of different magnitudes (typical sizes 0.5 to 8, some
          values in the tens), signed and skewed, weakly correlated, about 30% positives
"""
import math
import os

import numpy as np

from ..base.errors import ConfigError
from ..base.files import atomic_file
from ..kernels.synth import criteo_rows, max_bytes_per_row, write_rows

ZIPF_EXPONENT = 1.1
NUMERIC_FIELDS = 2
BIAS = -1.4          # about 25% positives, like a click-through log
MARGIN_STD = 1.5     # spread of the planted model's margins (and of the pairwise term)


def zipf_cdf(vocab: int, exponent: float = ZIPF_EXPONENT) -> np.ndarray:
    weights = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def write_svmlight(path: str, seed: int, first_row: int, n_rows: int, n_fields: int,
                   features: int, rows_per_chunk: int = 50000, rank: int = 0,
                   ffm: bool = False) -> int:
    """Write rows [first_row, first_row + n_rows) to `path` atomically (as libffm text with
    `ffm`: each feature with its field). Returns positives."""
    n_numeric = min(NUMERIC_FIELDS, n_fields)
    n_categorical = max(n_fields - n_numeric, 1)
    cdf = zipf_cdf(max(features // n_categorical, 1))
    sigma = MARGIN_STD / math.sqrt(n_fields)
    # The pairwise term sums n(n-1)/2 products of `rank` terms of variance tau^4 each.
    pairs = max(n_fields * (n_fields - 1) / 2 * rank, 1)
    tau = math.sqrt(MARGIN_STD / math.sqrt(pairs))
    buf = np.empty(max_bytes_per_row(n_fields) * rows_per_chunk, np.uint8)
    positives = 0
    with atomic_file(path, "wb") as f:
        for start in range(first_row, first_row + n_rows, rows_per_chunk):
            count = min(rows_per_chunk, first_row + n_rows - start)
            nbytes, pos = write_rows(seed, start, count, n_fields, n_numeric, cdf, BIAS, sigma,
                                     buf, rank, tau, ffm)
            positives += pos
            f.write(buf[:nbytes].data)
    return positives


KINDS = ("ctr", "census", "dense")
EXTENSIONS = {"svmlight": "svm", "libffm": "ffm", "criteo": "tsv"}
CRITEO_EMPTY = 0.15   # share of empty fields in the Criteo layout


def write_criteo(path: str, seed: int, first_row: int, n_rows: int, features: int) -> int:
    """Rows [first_row, first_row + n_rows) in the Criteo layout (label, 13 integer and 26
    hexadecimal fields, tab separated, some empty) to `path`, atomically; returns
    positives."""
    cdf = zipf_cdf(max(features // 26, 1))
    sigma = MARGIN_STD / math.sqrt(39 * (1 - CRITEO_EMPTY))
    positives = 0
    with atomic_file(path, "w") as f:
        for start in range(first_row, first_row + n_rows, CHUNK):
            count = min(CHUNK, first_row + n_rows - start)
            ints = np.empty((count, 13), np.int64)
            cats = np.empty((count, 26), np.int64)
            labels = np.empty(count, np.int64)
            criteo_rows(seed, start, ints, cats, labels, BIAS, sigma, cdf, CRITEO_EMPTY)
            lines = ["\t".join([str(y)] + ["" if v < 0 else str(v) for v in i]
                               + ["" if v < 0 else f"{v:08x}" for v in c])
                     for y, i, c in zip(labels.tolist(), ints.tolist(), cats.tolist())]
            f.write("\n".join(lines) + "\n")
            positives += int(labels.sum())
    return positives


def make_data(prefix: str, rows: int, features: int | None = None, nnz: int | None = None,
              seed: int = 1, test_rows: int | None = None, kind: str = "ctr",
              interactions: int = 0, fmt: str = "svmlight") -> dict:
    """Write PREFIX.train.svm (rows) and PREFIX.test.svm (test_rows, default rows // 5); with
    fmt "libffm" PREFIX.train.ffm and PREFIX.test.ffm (ctr: the same rows, each feature with
    its field); with fmt "criteo" PREFIX.train.tsv and PREFIX.test.tsv in the Criteo
    layout. `features`, `nnz` and `interactions` (the planted latent vectors' length, 0:
    none) shape the ctr kind only (default 2^20, 20 and 0)."""
    if fmt not in EXTENSIONS:
        raise ConfigError(f"--format must be one of {', '.join(EXTENSIONS)}, got {fmt!r}")
    if fmt == "libffm" and kind != "ctr":
        raise ConfigError(f"--format libffm writes --kind ctr only (a field per feature), "
                          f"not {kind}")
    if fmt == "criteo" and (kind != "ctr" or nnz is not None or interactions):
        raise ConfigError("--format criteo writes its own layout: 39 fields a row, no "
                          "--kind, --nnz or --interactions")
    if kind != "ctr" and interactions:
        raise ConfigError(f"--interactions shapes --kind ctr only, not {kind}")
    if not 0 <= interactions <= 64:
        raise ConfigError(f"--interactions must be from 0 to 64, got {interactions}")
    # The test file is written first, so an existing train file means both are complete.
    if kind not in KINDS:
        raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind != "ctr" and (features, nnz) != (None, None):
        raise ConfigError(f"--features and --nnz shape --kind ctr only, not {kind}")
    features = 1 << 20 if features is None else features
    nnz = 20 if nnz is None else nnz
    if test_rows is None:
        test_rows = max(rows // 5, 1)
    for name, value in (("--rows", rows), ("--features", features), ("--nnz", nnz)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    if test_rows < 0:
        raise ConfigError(f"--test-rows must be >= 0, got {test_rows}")
    if seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {seed}")
    parent = os.path.dirname(os.path.abspath(prefix))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"PREFIX {prefix}: cannot make its directory {parent} "
                          f"({e.strerror}: {e.filename})") from None
    out = {}
    model = TABULAR[kind](seed) if kind != "ctr" else None
    bias = _calibrated_bias(model, seed) if model else 0.0
    for name, first, count in (("test", rows, test_rows), ("train", 0, rows)):
        path = f"{prefix}.{name}.{EXTENSIONS[fmt]}"
        if fmt == "criteo":
            positives = write_criteo(path, seed, first, count, features)
        elif kind == "ctr":
            positives = write_svmlight(path, seed, first, count, nnz, features,
                                       rank=interactions, ffm=fmt == "libffm")
        else:
            positives = write_tabular(path, model, bias, seed, first, count)
        out[name] = {"path": path, "rows": count, "positive_rate": positives / max(count, 1)}
    return out


# ---- census and dense: small tabular sets, generated with numpy ------------------------------

CHUNK = 10000   # rows per independently seeded block, so any row range can be written alone

# a9a's fields: age, workclass, fnlwgt, education, education-num, marital-status, occupation,
# relationship, race, sex, capital-gain, capital-loss, hours-per-week, native-country.
CENSUS_VALUES = (5, 8, 5, 16, 5, 7, 14, 6, 5, 2, 2, 2, 5, 41)
CENSUS_FREQUENT = (0.3, 0.7, 0.3, 0.33, 0.35, 0.46, 0.13, 0.4, 0.85, 0.67, 0.92, 0.95, 0.47, 0.9)
CENSUS_MISSING = (0, 0.05, 0, 0, 0, 0, 0.05, 0, 0, 0, 0, 0, 0, 0.02)
# dense: each feature's typical size; odd ones are skewed (log-normal, >= 0), even ones signed.
DENSE_SCALES = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 1.0, 2.0, 4.0, 6.0)


def _sigmoid(m: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-m))


class Census:
    """One categorical value per field (some missing), drawn given two hidden factors;
    label from a weight per value plus the first factor (which the features only reveal)."""
    code, positive_rate = 1, 0.24

    def __init__(self, seed: int):
        rng = np.random.default_rng([seed, self.code, 0])
        hidden = np.random.default_rng([seed, self.code, 1]).normal(size=(10000, 2))
        self.fields = []
        for values, frequent in zip(CENSUS_VALUES, CENSUS_FREQUENT):
            rest = 1.0 / np.arange(1, values)
            p = np.concatenate([[frequent], (1 - frequent) * rest / rest.sum()])
            loadings = rng.normal(0, 0.8, (values, 2))
            logits = np.log(p)
            for _ in range(10):   # the factors flatten the frequencies: restore them
                e = np.exp(logits + hidden @ loadings.T)
                logits += np.log(p / (e / e.sum(axis=1, keepdims=True)).mean(axis=0))
            self.fields.append((logits, loadings, rng.normal(0, 0.6, values)))

    def rows(self, rng, n: int):
        """(margins without the intercept, indptr, keys, values) of n rows."""
        hidden = rng.normal(size=(n, 2))
        margin = hidden[:, 0].copy()
        columns, offset = [], 0
        for (logp, loadings, weights), missing in zip(self.fields, CENSUS_MISSING):
            value = np.argmax(logp + hidden @ loadings.T + rng.gumbel(size=(n, logp.shape[0])),
                              axis=1)
            present = rng.random(n) >= missing
            margin += np.where(present, weights[value], 0.0)
            columns.append(np.where(present, offset + value + 1, 0))
            offset += logp.shape[0]
        keys = np.stack(columns, axis=1)
        present = keys > 0
        indptr = np.concatenate([[0], np.cumsum(present.sum(axis=1))])
        return margin, indptr, keys[present], np.ones(int(present.sum()))


class Dense:
    """Ten weakly correlated real-valued features of different magnitudes; the label depends
    linearly on their standardized hidden values (so skewed features are not linear in it)."""
    code, positive_rate = 2, 0.3

    def __init__(self, seed: int):
        rng = np.random.default_rng([seed, self.code, 0])
        d = len(DENSE_SCALES)
        self.loadings = rng.normal(0, 0.3, (d, 3))
        self.weights = rng.normal(0, 0.6, d)

    def rows(self, rng, n: int):
        d = len(DENSE_SCALES)
        u = rng.normal(size=(n, 3)) @ self.loadings.T + rng.normal(size=(n, d))
        u /= np.sqrt((self.loadings ** 2).sum(axis=1) + 1.0)
        scales = np.asarray(DENSE_SCALES)
        x = np.where(np.arange(d) % 2 == 1, scales * np.exp(0.7 * u), scales * u)
        indptr = np.arange(0, n * d + 1, d)
        return u @ self.weights, indptr, np.tile(np.arange(1, d + 1), n), x.ravel()


TABULAR = {"census": Census, "dense": Dense}


def _calibrated_bias(model, seed: int) -> float:
    """The intercept that gives the model's positive rate, by bisection on a pilot sample."""
    margins = model.rows(np.random.default_rng([seed, model.code, 2]), 20000)[0]
    lo, hi = -10.0, 10.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _sigmoid(mid + margins).mean() > model.positive_rate else (mid, hi)
    return (lo + hi) / 2


def _svmlight_lines(labels, indptr, keys, values) -> str:
    text = []
    for r in range(labels.shape[0]):
        a, b = indptr[r], indptr[r + 1]
        text.append(" ".join([str(int(labels[r]))] + [
            f"{k}:{v:.5g}" for k, v in zip(keys[a:b].tolist(), values[a:b].tolist())]))
    return "\n".join(text) + "\n"


def write_tabular(path: str, model, bias: float, seed: int, first_row: int, n_rows: int) -> int:
    """Rows [first_row, first_row + n_rows) of a census or dense set to `path`, atomically;
    rows come in blocks of CHUNK, each seeded by (seed, kind, block). Returns positives."""
    positives = 0
    with atomic_file(path, "w") as f:
        for block in range(first_row // CHUNK, -(-(first_row + n_rows) // CHUNK)):
            rng = np.random.default_rng([seed, model.code, 3, block])
            margins, indptr, keys, values = model.rows(rng, CHUNK)
            labels = rng.random(CHUNK) < _sigmoid(bias + margins)
            a = max(first_row - block * CHUNK, 0)
            b = min(first_row + n_rows - block * CHUNK, CHUNK)
            lo, hi = indptr[a], indptr[b]
            f.write(_svmlight_lines(labels[a:b], indptr[a:b + 1] - lo, keys[lo:hi],
                                    values[lo:hi]))
            positives += int(labels[a:b].sum())
    return positives
