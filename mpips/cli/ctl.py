"""`python -m mpips ctl RUN_DIR ...`: ask a running job to change its servers or workers,
and wait for the answer (the channel is `control`'s files in RUN_DIR)."""
import json
import sys
from typing import NoReturn

from ..base.errors import MpipsError
from ..membership import channel

DESCRIPTION = """\
Ask the job training into RUN_DIR (its --out) to change while it trains, and wait until
the change is done:

  status             the servers and the key ranges each owns, the spares, the workers'
                     clocks
  add-server [N]     a spare server (--spares; by default the first) takes key ranges from
                     the fullest servers: about 1/n of the keys move
  remove-server N    server N hands its key ranges to the emptiest servers and stays on as
                     a spare (it can be added again)
  rebalance          key ranges move from the server that has answered the most reads
                     since the last move to the one that answered the fewest
  remove-worker N    worker N stops after the minibatch it is at; the rows it had left
                     (of this epoch and the later ones) are shared among the workers still
                     training; it stays on, idle, and scores its share of the test file
  add-worker [N]     an idle worker (one that left, or finished its rows; by default the
                     first that left) joins again: each of the n workers training keeps n
                     shares of the rows it has left and gives it one (under --balance
                     dynamic it asks the lead for chunks of the rows left, as the others do)

The lead server (server 0; after its death under hot failover, the first living server,
which takes over RUN_DIR/mpips.lock) takes requests from RUN_DIR/control/ five times a
second. A server change happens at a clock every server agrees on: the servers hand over key
ranges, the workers wait meanwhile, then read from the new owners. Under BSP the model stays
bitwise that of a run without the change. The answer (what moved, how long it took) is
printed, kept in RUN_DIR/control/answer-ID.json, and listed in summary.json's "moves".
A worker's rows move where it stands, so no row is lost or trained twice in an epoch, but
the minibatches differ from a run without the change: the model is not bitwise the same.
MPI cannot add ranks to a running job: keep spare workers by launching more and removing
them at the start."""


def add_parser(sub) -> None:
    import argparse
    p = sub.add_parser("ctl", help="change a running job's servers or workers (join, leave, "
                                   "rebalance)",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="the job's --out directory")
    p.add_argument("what", metavar="COMMAND", choices=channel.COMMANDS,
                   help=", ".join(channel.COMMANDS))
    p.add_argument("target", metavar="N", type=int, nargs="?",
                   help="the server (remove-server, add-server) or worker")
    p.add_argument("--wait", type=float, default=600.0, metavar="S",
                   help="seconds to wait for the answer (default 600)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.set_defaults(run=run)


def _fail(text: str) -> NoReturn:
    print(f"mpips ctl: error: {text}", file=sys.stderr, flush=True)
    sys.exit(2)


def run(args) -> None:
    from ..storage import rundir  # here: every `train` rank builds ctl's parser (start-up time)
    if args.what in ("remove-server", "remove-worker") and args.target is None:
        _fail(f"{args.what} needs the number of the {args.what[7:]} to remove (see ctl status)")
    if args.what in ("status", "rebalance") and args.target is not None:
        _fail(f"{args.what} takes no N (it was given {args.target})")
    holder, not_running = rundir.running_job(args.run_dir)
    if holder is None or not_running:   # no holder comes with a reason
        _fail(f"no job is training into {args.run_dir}: {not_running}")
    try:
        ident = channel.submit(args.run_dir, args.what, args.target, holder.get("run_id"))
        if args.what != "status":
            print(f"asked the job {holder.get('run_id', '')} to {args.what}"
                  f"{'' if args.target is None else f' {args.target}'} (request {ident}); "
                  f"waiting up to {args.wait:g} s", file=sys.stderr, flush=True)
        answer = channel.wait_answer(
            args.run_dir, ident, args.wait,
            running=lambda: rundir.running_job(args.run_dir)[1] is None)
    except (OSError, MpipsError) as e:
        _fail(str(e))
    if args.json:
        print(json.dumps(answer, indent=1))
    else:
        print(describe(answer))
    sys.exit(0 if answer.get("ok") else 1)


def describe(answer: dict) -> str:
    """An answer as lines for a person."""
    if not answer.get("ok"):
        return f"refused: {answer.get('error')}"
    if "servers" in answer and "placement_version" in answer:   # status
        lines = [f"placement version {answer['placement_version']}: {answer['ranges']} key "
                 f"ranges, {answer['replicas']} cop{'y' if answer['replicas'] == 1 else 'ies'} "
                 f"of each; {answer['moves']} move(s) so far"
                 + (f"; server {answer['lead']} leads" if "lead" in answer else "")]
        for s in answer["servers"]:
            lines.append(f"  server {s['server']} (rank {s['rank']}): {s['state']}, "
                         f"{s['ranges']} range(s)")
        for w in answer["workers"]:
            lines.append(f"  worker {w['worker']} (rank {w['rank']}): clock {w['clock']}"
                         + (f", {w['state']}" if "state" in w else ""))
        return "\n".join(lines)
    target = "" if answer.get("target") is None else f" {answer['target']}"
    if answer.get("command") == "add-worker":
        rows = (f"with a share of the rows left of worker(s) "
                f"{', '.join(map(str, answer['from']))}" if answer["from"] else
                "asking for chunks of the rows left (--balance dynamic)")
        return (f"add-worker{target} done: it trains again from clock {answer['clock']}, "
                f"{rows} ({answer['seconds']:.2f} s after the request)")
    if answer.get("command") == "remove-worker":
        rest = (f"its rows left from epoch {answer['from_epoch']} go to worker(s) "
                f"{', '.join(map(str, answer['handed_to']))}" if answer["handed_to"]
                else "its chunks left go to the next workers that ask (--balance dynamic)"
                if answer.get("chunks_back") else "it had trained all its rows")
        return (f"remove-worker{target} done: it left at clock {answer['clock']} "
                f"({answer['seconds']:.2f} s after the request); {rest}")
    share = 100 * answer["fraction_moved"]
    lines = [f"{answer['command']}{target} done at clock {answer['clock']} (placement version "
             f"{answer['version']}): {answer['ranges_moved']} key range(s) moved ({share:.1f}% "
             f"of the keys), {answer['keys_moved']:,} keys copied in {answer['copy_s']:.2f} s "
             f"while training went on, {answer['seconds']:.2f} s in all; training waited "
             f"{answer['paused_s']:.2f} s for the switch"]
    if "load_spread_before" in answer:
        lines.append(f"busiest server's reads over the mean: {answer['load_spread_before']:.3f} "
                     f"before, {answer['load_spread_after']:.3f} after")
    before, after = answer["ranges_before"], answer["ranges_after"]
    lines.append("ranges per server: " + ", ".join(
        f"{s}: {before[s]}" + (f" -> {after[s]}" if after[s] != before[s] else "")
        for s in sorted(before, key=int)))
    return "\n".join(lines)
