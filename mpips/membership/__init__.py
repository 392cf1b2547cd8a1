"""Ranks and key ranges changing on request in a running job (`mpips ctl`): the channel of
requests in the run directory, range moves between servers, workers joining and leaving.
Handlers reach the server only through the narrow context they are given.
May import: base, ranks, wire, data."""
