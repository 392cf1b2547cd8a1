"""The MPI process level: splitting a job into servers and workers, waits with a bound,
collectives every rank takes part in, ULFM deaths and survivors, and leaving a launch
together. May import: base, wire (its tags)."""
