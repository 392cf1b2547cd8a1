"""The rows a server found for a worker's recent pulls, so that a push of the same keys
(SAME_KEYS) needs neither the keys on the wire again nor a second lookup in the table."""
from ..base.errors import ProtocolError

KEEP = 4   # pulls remembered per worker; the client reuses only its last two


class RowCache:
    def __init__(self, n_workers: int):
        # per worker: ts -> (keys, rows, generation), oldest first (a dict keeps the order)
        self._pulled: list[dict[int, tuple]] = [{} for _ in range(n_workers)]

    def remember(self, worker: int, ts: int, keys, rows, generation: int) -> None:
        """Pull `ts` of `worker` found `keys` at `rows` while the table was at `generation`
        (`keys` must not change afterwards: pass a copy of a receive buffer)."""
        pulled = self._pulled[worker]
        pulled[ts] = (keys, rows, generation)
        while len(pulled) > KEEP:
            del pulled[next(iter(pulled))]

    def take(self, worker: int, ts: int, n_keys: int):
        """(keys, rows, generation) of pull `ts`, for a push over its `n_keys` keys; each pull
        serves one push. ProtocolError if this server does not hold it."""
        entry = self._pulled[worker].pop(ts, None)
        if entry is None or entry[0].shape[0] != n_keys:
            raise ProtocolError(f"worker {worker} pushed values for the {n_keys} keys of pull "
                                f"#{ts}, which this server does not hold")
        return entry
