"""The command line, `python -m mpips COMMAND`: the parser of every command, `train`,
`ctl`, the commands that write datasets and those that describe runs and models (score,
report, schedule, inspect). May import: every package but the face (mpips/__init__, api)."""
