"""Reads on a server: a worker's pull answered, held for the clocks, or refused (see
readgate), and the trained model's weights read once every worker has finished (scoring).
"""
import numpy as np

from ..kernels import requests
from ..wire import protocol
from ..wire.clocks import FINISHED
from ..wire.protocol import Op
from .readgate import HOLD, SERVE, Pull


class Reads:
    def __init__(self, ctx):
        self.ctx = ctx
        self._check_of: tuple = (None, None)   # (placement, read counts) _check was made for
        self._check: tuple = ()
        ctx.register({Op.PULL: self.on_pull})

    def on_pull(self, source: int, r, buf) -> None:
        # READ_ONLY only spares storing unknown keys: the clocks apply to every read.
        pull = Pull(self.ctx.roles.worker_index(source), source, r.header.ts, r.keys,
                    insert=not r.header.flags & protocol.READ_ONLY, version=r.header.placement)
        verdict = self.ctx.gate.arrive(pull,
                                       next_clock=bool(r.header.flags & protocol.NEXT_CLOCK))
        if verdict == SERVE:
            self._serve(pull)
        elif verdict != HOLD:
            self._refuse(pull)

    def release(self) -> None:
        """Answer the pulls held that the clocks now let through (or refuse them)."""
        if not self.ctx.gate.held:
            return
        serve, refuse = self.ctx.gate.release()
        for pull in refuse:
            self._refuse(pull)
        for pull in serve:
            self._serve(pull)

    def serve_checked(self, worker: int, source: int, h, buf: np.ndarray, clock: int) -> bool:
        """Serve the pull in `buf` (header `h`) of `worker` for `clock`, which the clocks let
        through: its keys are checked as they are looked up (Placement.key_check, with
        admission's rules for a pull's keys). False, with nothing done, if they fail."""
        ctx = self.ctx
        keys, check = np.empty(h.nkeys, np.uint64), self._key_check()
        out = np.empty((h.nkeys, ctx.store.width), np.float32)
        insert = not h.flags & protocol.READ_ONLY
        rows, _ = ctx.store.find_checked(buf, protocol.HEADER_BYTES, check, keys, insert, out)
        if rows is None:
            return False
        ctx.gate.served_at(worker, clock)
        self._answer(worker, source, h.ts, keys, rows, out, insert)
        return True

    def hold_checked(self, worker: int, source: int, h, buf: np.ndarray, clock: int) -> bool:
        """Hold the pull in `buf` (header `h`) of `worker` for `clock`, which the clocks do not
        let through yet, its keys checked as `serve_checked` checks them; False, with nothing
        done, if they fail."""
        keys, (bounds, allowed, counts) = np.empty(h.nkeys, np.uint64), self._key_check()
        if requests.pull_keys(buf, protocol.HEADER_BYTES, bounds, allowed, counts, keys) >= 0:
            return False
        self.ctx.gate.hold(Pull(worker, source, h.ts, keys, not h.flags & protocol.READ_ONLY,
                                clock=clock, owned=True, version=h.placement))
        return True

    def _key_check(self) -> tuple:
        """How a kernel checks a pull's keys here (Placement.key_check), the reads counted;
        made again only when the placement changes (asked of every pull)."""
        ctx = self.ctx
        placement, load = self._check_of
        if placement is not ctx.placement or load is not ctx.members.load:
            placement, load = self._check_of = (ctx.placement, ctx.members.load)
            self._check = placement.key_check(ctx.roles.index, True, load)
        return self._check

    def _serve(self, pull: Pull) -> None:
        ctx = self.ctx
        ctx.gate.served(pull)
        if ctx.clocks.done[pull.worker] == FINISHED and not pull.insert:   # scoring
            ctx.reply(self.final_weights(pull.keys), pull.source, pull.ts)
            return
        out = np.empty((pull.keys.shape[0], ctx.store.width), np.float32)
        rows = ctx.store.find(pull.keys, pull.insert, out)
        keys = pull.keys if pull.owned or not pull.insert else pull.keys.copy()
        self._answer(pull.worker, pull.source, pull.ts, keys, rows, out, pull.insert)

    def _answer(self, worker: int, source: int, ts: int, keys: np.ndarray, rows: np.ndarray,
                out: np.ndarray, insert: bool) -> None:
        """Reply to pull `ts` with `out`, the weights of `keys` found at `rows`, which a push
        of the same keys reuses if the pull stored unknown keys (`insert`)."""
        ctx = self.ctx
        ctx.stats.keys_served += keys.shape[0]
        if insert:
            ctx.rows.remember(worker, ts, keys, rows, ctx.store.generation)
        ctx.reply(out, source, ts)

    def final_weights(self, keys: np.ndarray) -> np.ndarray:
        """The trained model's weights of `keys` (zeros for keys never trained), once every
        worker has finished: nothing is stored."""
        store, stats = self.ctx.store, self.ctx.stats
        stats.keys_served += keys.shape[0]
        out = np.empty((keys.shape[0], store.width), np.float32)
        rows = store.find(keys, False, out)
        stats.test_keys += keys.shape[0]
        stats.test_keys_known += int((rows >= 0).sum())
        if store.optimizer.averages:
            out = store.model_weights(rows, self.ctx.clocks.longest)
        return out

    def _refuse(self, pull: Pull) -> None:
        """An empty reply: the job has stopped (a checkpoint holds the model)."""
        self.ctx.reply(np.empty(0, np.float32), pull.source, pull.ts)
