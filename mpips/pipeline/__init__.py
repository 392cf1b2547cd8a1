"""Pipelines of network stages over ranks: schedules as data (printable, testable) and one
stage rank's loop that runs its list of the schedule. May import: base, ranks, models."""
