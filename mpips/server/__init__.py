"""One server: its event loop (receive, admit, dispatch), the store of its shard, dense
tables and their named operations, the context its handlers receive (`context`), and the
objects the loop owns: the read gate, pushes and the clocks (BSP's ordered application),
reads, checkpoint rounds, the stop protocol, the outbox, the watchdog and the timers.
May import: kernels, base, ranks, wire, data, storage, models, recovery, membership."""
