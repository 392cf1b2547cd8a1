"""What a worker's push sends of its gradients (--push-values, --push-threshold,
--push-skip-zeros), with error feedback: what a push does not deliver of a key's gradient
(the rounding to float16 or int8, a row held back) the worker keeps, by key, and adds to
that key's next gradient. It is delayed, never lost, as long as the key comes back, or until
the worker's last push, which flushes it (`flushing`, `prepare(flush=True)`).

`KVWorker.push` calls `prepare` once a push, with the push's keys grouped by server: it gives
each server's part encoded and the rows that go. Each filter counts its work (`figures`, the
fields of FIGURES: the worker's summary record). No MPI here.
"""
import logging
from typing import NamedTuple

import numpy as np

from ..kernels import residuals
from ..wire import encoding

log = logging.getLogger("mpips")

RESIDUAL_BYTES = 1 << 27   # the most a worker's residuals take; keys past it lose theirs
FIRST_ROWS = 1 << 12
BLOCK_ROWS = 1024          # rows over which a row's bytes are counted (int8: with its scales)

# What a worker's filter reports (summary.RECORD fields; summed over workers in summary.json).
FIGURES = (
    "push_rows",               # rows pushed (to their primaries), the flush's included
    "push_rows_held",          # rows held back (threshold, zero weights), once per push
    "residual_keys_dropped",   # residuals that found no room in the table (lost), once a push
    "residual_keys_flushed",   # keys whose residual the last push delivered
    "residual_flushed",        # the sum of |residual| it delivered
    "residual_keys_left",      # keys whose residual was never sent (a stop, a leave mid-way)
    "residual_left",           # the sum of |residual| never sent
)


_NONE_HELD = np.zeros(0, np.bool_)


class Outgoing(NamedTuple):
    kept: np.ndarray | None    # bool per key, in key order: its row is sent (None: every row)
    skept: np.ndarray | None   # the same, in server order (see Placement.split)
    values: np.ndarray         # key order: what the servers apply (a row held back: zeros)
    svalues: np.ndarray        # server order: the rows sent, as the servers apply them
    offsets: np.ndarray        # each server's part of svalues
    parts: list                # per server: (PUSH flags, the bytes of its part's values)


class Plain:
    """No filter: every row, float32, as given."""

    def __init__(self):
        self.rows = 0   # rows pushed

    def flushing(self, keys, values):
        return keys, values

    def prepare(self, keys, values, perm, offsets, weights=None,
                flush: bool = False) -> Outgoing:
        self.rows += keys.shape[0]
        if perm is None and offsets.shape[0] == 2:   # (one server: asked of every push)
            return Outgoing(None, None, values, values, offsets, [(0, values)])
        svalues = values if perm is None else values[perm]
        bounds = offsets.tolist()
        parts = [(0, svalues[bounds[s]:bounds[s + 1]]) for s in range(len(bounds) - 1)]
        return Outgoing(None, None, values, svalues, offsets, parts)

    def figures(self) -> dict:
        return dict.fromkeys(FIGURES, 0) | {"push_rows": self.rows}


def merged(keys: np.ndarray, values: np.ndarray, more: np.ndarray):
    """(keys, values) with the sorted keys `more` added (zero rows), in key order; `keys`
    itself when none is new."""
    extra = more[~np.isin(more, keys, assume_unique=True)]
    if not extra.shape[0]:
        return keys, values
    union = np.union1d(keys, extra)
    out = np.zeros((union.shape[0], values.shape[1]), values.dtype)
    out[np.searchsorted(union, keys)] = values
    return union, out


class PushFilter:
    def __init__(self, width: int, values: str = "float32", threshold: float = 0.0,
                 l1: float = 0.0, max_bytes: int = RESIDUAL_BYTES):
        """`values`: float32, float16 or int8 (see encoding.encode_values); a row is held back
        while every entry is below `threshold` in magnitude, or (l1 > 0) while its pulled
        weights are 0 and every entry is at most `l1` (see kernels.residuals.select_rows)."""
        self.width = width
        self.flags = encoding.ENCODINGS[values]
        self.threshold = threshold
        self.l1 = l1
        per_row = 9 + 4 * width
        self._max_rows = 1 << max(int(max_bytes // per_row).bit_length() - 1, 4)
        self._allocate(min(FIRST_ROWS, self._max_rows))
        self._none = np.empty((0, width), np.float32)
        self.lost = 0   # keys whose residual found no room in the table
        self.rows = 0   # rows sent
        self.held = 0   # rows held back
        self.flushed_keys, self.flushed = 0, 0.0

    def _allocate(self, rows: int) -> None:
        self._keys = np.zeros(rows, np.uint64)
        self._used = np.zeros(rows, np.uint8)
        self._values = np.zeros((rows, self.width), np.float32)
        self._meta = np.zeros(1, np.int64)

    @property
    def _limit(self) -> int:
        return self._keys.shape[0] * 3 // 4

    def _make_room(self, new: int) -> None:
        """Grow the table (doubling, up to its bound) so that `new` more keys fit."""
        rows = self._keys.shape[0]
        while int(self._meta[0]) + new > rows * 3 // 4 and rows < self._max_rows:
            rows *= 2
        if rows == self._keys.shape[0]:
            return
        old = self._keys, self._used, self._values, self._meta
        self._allocate(rows)
        self._meta[0] = old[3][0]
        residuals.rehash(*old[:3], self._keys, self._used, self._values)

    def _gather(self, keys: np.ndarray, values: np.ndarray):
        """(slots, values plus each key's residual)."""
        slots = np.empty(keys.shape[0], np.int64)
        out = np.empty_like(values)
        residuals.gather(self._keys, self._used, self._values, keys, values,
                         self._limit - int(self._meta[0]), slots, out)
        return slots, out

    def residuals(self, keys: np.ndarray) -> np.ndarray:
        """What is kept back of each key's gradients (zeros for a key without any)."""
        return self._gather(keys, np.zeros((keys.shape[0], self.width), np.float32))[1]

    def pending(self) -> np.ndarray:
        """The keys whose last push held their row back, with a residual not zero, sorted."""
        held = (self._used == residuals.HELD) & self._values.any(axis=1)
        return np.sort(self._keys[held])

    def flushing(self, keys, values):
        """(keys, values) of a last push that delivers every row held back: `keys` and the
        keys of `pending` (zero gradients), sorted; `keys` itself if it holds them all. The
        rounding of rows sent stays: it is less than the row a push would spend on it."""
        return merged(keys, values, self.pending())

    def figures(self) -> dict:
        held = self._used.astype(np.bool_)
        left = np.abs(self._values[held]).sum(axis=1, dtype=np.float64)
        return {"push_rows": self.rows, "push_rows_held": self.held,
                "residual_keys_dropped": self.lost, "residual_keys_flushed": self.flushed_keys,
                "residual_flushed": self.flushed,
                "residual_keys_left": int(np.count_nonzero(left)),
                "residual_left": float(left.sum())}

    def _rows_sent(self, grads, slots, weights, perm):
        """(kept, skept) of Outgoing. The push sends every row where a bitmap over its keys
        (which names the rows a push of a pull's keys sends) would cost more than the rows it
        holds back: decided for the whole push, not for each server's part, so that what a key
        sends never depends on which server holds it, nor on how many there are."""
        if not (self.threshold > 0 or self.l1 > 0):
            return None, None
        n = grads.shape[0]
        kept = np.empty(n, np.bool_)
        held = n - residuals.select_rows(grads, self._none if weights is None else weights,
                                         self.threshold, self.l1, slots, kept)
        row_bytes = encoding.values_bytes(BLOCK_ROWS, self.width, self.flags) / BLOCK_ROWS
        if not held or n / 8 >= held * row_bytes:
            return None, None
        return kept, (kept if perm is None else kept[perm])

    def prepare(self, keys, values, perm, offsets, weights=None,
                flush: bool = False) -> Outgoing:
        """What to send of `values` (float32[len(keys), width], key order) for `keys`, grouped
        by server as (perm, offsets) say; `weights`: those pulled for them, if any (see
        _rows_sent). Each key's residual is
        added first, and what is not sent becomes its residual. With `flush` (the worker's
        last push) every row goes, float32, and no residual is left of these keys."""
        n = keys.shape[0]
        self._make_room(n)
        slots, grads = self._gather(keys, values)
        if flush:
            kept = skept = None
            delivered = np.abs(self._values[slots[slots >= 0]]).sum(axis=1, dtype=np.float64)
            self.flushed_keys += int(np.count_nonzero(delivered))
            self.flushed += float(delivered.sum())
        else:
            kept, skept = self._rows_sent(grads, slots, weights, perm)
        flags = 0 if flush else self.flags
        sent_rows = n if kept is None else int(np.count_nonzero(kept))
        self.rows += sent_rows
        self.held += n - sent_rows
        sgrads = grads if perm is None else grads[perm]
        if skept is not None:
            sgrads = sgrads[skept]
            before = np.zeros(n + 1, np.int64)
            np.cumsum(skept, out=before[1:])
            offsets = before[offsets]
        svalues = np.empty_like(sgrads)
        parts = []
        for s in range(offsets.shape[0] - 1):
            a, b = offsets[s], offsets[s + 1]
            data, applied = encoding.encode_values(sgrads[a:b], flags)
            svalues[a:b] = applied
            parts.append((flags, data))
        sent = svalues
        if skept is not None:
            sent = np.zeros_like(grads)
            sent[skept] = svalues
        if perm is not None:
            by_key = np.empty_like(sent)
            by_key[perm] = sent
            sent = by_key
        lost = residuals.keep(self._keys, self._used, self._values, self._meta, keys, slots,
                              grads - sent, _NONE_HELD if kept is None else ~kept)
        if lost and not self.lost:
            log.warning("the push filter's residuals fill their table (%d keys): from now on "
                        "the rounding of keys not in it is lost", int(self._meta[0]))
        self.lost += lost
        return Outgoing(kept, skept, sent, svalues, offsets, parts)
