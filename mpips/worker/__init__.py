"""A worker's handles on the servers, after ps-lite: the KV client (pull, push, wait and
their failover repair), the conversation with the lead server, the link beneath both
(requests, replies, bounded waits), push filters, and the dense table handle.
May import: kernels, base, ranks, wire, data, storage, models."""
