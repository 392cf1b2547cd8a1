"""What servers do when a rank dies under ULFM: take over a dead server's ranges from
their living copies, rebuild lost copies, and settle a dead worker's clocks and rows.
Handlers reach the server only through the narrow context they are given.
May import: base, ranks, wire, data."""
