"""A shard's rows cut in minibatches: the pieces its reader yields (a chunk of text, a Parquet
row group), joined and cut in minibatches of a fixed number of rows, with where the rows
handed out end. Shared by the text and Parquet readers; `RowSpan`, the rows of a shard read by
row number (a converted dataset's, Parquet's)."""


class RowSpan:
    """A shard's rows [start, stop) of its input, by row number."""
    start: int
    stop: int

    def next_row_at(self, row: int) -> int | None:
        """The first of this shard's rows at or after `row` (None if there is none)."""
        if row >= self.stop:
            return None
        return max(row, self.start)

    def fraction_at(self, row: int) -> float:
        """How much of the shard comes before `row`."""
        span = self.stop - self.start
        return 1.0 if span <= 0 else (row - self.start) / span


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
