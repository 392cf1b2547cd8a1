"""One server: its event loop (receive, admit, dispatch), the store of its shard, dense
tables and their named operations, and the objects the loop owns: the read gate, BSP's
push buffer, checkpoint rounds, the stop protocol, the outbox and the watchdog.
May import: kernels, base, ranks, wire, data, storage, models, recovery, membership."""
