"""A worker's part in scoring the test rows once training is over (see job.scoring for the
whole): the chunks the lead hands it, or a fixed part of the file, scored with read-only
pulls, one pull ahead. No numeric loops here: margins come from the model's kernels."""
from dataclasses import dataclass

import numpy as np

from ..data.shards import open_shard, spans
from ..data.textfile import KeyIndexer
from ..run import testevents
from .chunks import EVAL_BATCH, HeldOutFile, concatenated, shared


def _margins(model, kv, pull, batch, cols, bias_col):
    """(margins, labels) of a test batch, once its pull is answered."""
    return model.margins(batch, cols, bias_col, kv.wait(pull)), batch.labels


@dataclass
class Share:
    """What a rank scored of the test file."""
    margins: np.ndarray
    labels: np.ndarray
    bad_lines: int    # skipped
    units: int        # rows or bytes of the file its chunks or part span (see chunks.covered)


def worker_share(cfg, roles, kv, deaths: tuple = (), part: tuple | None = None, model=None,
                 hot: bool = False) -> Share:
    """A worker's part in scoring (`kv`: its KVWorker): its share of the test file under the
    final model: the chunks the lead hands out, or else a part of the file, shared among the
    workers alive (as far as this one knows) or the `part` (this one's, parts) given.
    `model`: what gives margins (a pipeline's first stage), if not the job's model; `hot`:
    under ULFM (each chunk asked for once the last is scored)."""
    units: list[tuple[int, int]] = []   # the spans of the file scored
    if part is None and shared(cfg):
        shards = _chunks_handed_out(kv, HeldOutFile(cfg), units, ahead=not hot)
    else:
        dead = {d.worker for d in deaths if d.dead}
        living = [w for w in range(len(roles.workers)) if w not in dead]
        index, parts = part or (living.index(roles.index), len(living))
        shards = [open_shard(cfg.data.test, index, parts, skip_bad=cfg.data.skip_bad_lines)]
        units.append(spans(cfg.data.test, parts)[index])
    model = model or cfg.model.spec()
    scored, index, pending, bad_lines = [], KeyIndexer(model.reserved_keys()), None, 0
    # One pull ahead: the servers look up the next batch's keys while this one is scored.
    for number, shard in enumerate(shards, 1):
        testevents.reached("chunk", number)
        for batch in shard.minibatches(EVAL_BATCH):
            keys, cols, bias_col = index(batch, cfg.model.bias, shard.path)
            pull = kv.pull(keys, read_only=True)
            if pending is not None:
                scored.append(_margins(model, kv, *pending))
            pending = (pull, batch, cols, bias_col)
        bad_lines += shard.bad_lines
        if hot and pending is not None:   # scored before the next chunk is asked for
            scored.append(_margins(model, kv, *pending))
            pending = None
    if pending is not None:
        scored.append(_margins(model, kv, *pending))
    return Share(*concatenated(scored), bad_lines, sum(b - a for a, b in units))


def _chunks_handed_out(kv, test: HeldOutFile, units: list, ahead: bool = True):
    """The shards of the chunks of the test file the lead hands this worker, each span added
    to `units`; `ahead`: the next asked for while one is scored, else once it is."""
    asked = kv.lead.test_chunk()
    while True:
        span = kv.wait(asked)
        shard = test.chunk(span, "the lead server")
        if shard is None:
            return
        units.append(tuple(span))
        if ahead:
            asked = kv.lead.test_chunk()
        yield shard
        if not ahead:
            asked = kv.lead.test_chunk()
