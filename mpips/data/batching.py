"""A shard's rows cut in minibatches: the pieces its reader yields (a chunk of text, a Parquet
row group), joined and cut in minibatches of a fixed number of rows, with where the rows
handed out end. Shared by the text and Parquet readers."""


def in_minibatches(shard, batch_size: int, start: int | None = None):
    """The rows `shard.rows(start)` yields in pieces, as Rows of `batch_size` rows (the last
    may be smaller); `shard.handed_out` follows where the rows handed out end (a byte or a
    row: where the next minibatch starts)."""
    carry = None
    for rows in shard.rows(start):
        if carry is not None:
            rows = rows.concat([carry, rows])
        full = len(rows) // batch_size * batch_size
        for a in range(0, full, batch_size):
            b = a + batch_size
            shard.handed_out = int(rows.origins[b]) if b < len(rows) else shard.position
            yield rows.slice(a, b)
        carry = rows.slice(full, len(rows)) if full < len(rows) else None
    if carry is not None:
        shard.handed_out = shard.stop
        yield carry
