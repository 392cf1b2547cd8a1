"""The channel between `mpips ctl` and a running job: files in the run's directory.

`ctl` writes a request, `control/request-<id>.json`, atomically; the lead server looks for
requests five times a second, takes the oldest (renaming it `taken-<id>.json`), and writes the
answer `answer-<id>.json` once the change has finished (a status at once). A request names
the run it is for: one left from an earlier job in the same directory is answered as
discarded, never carried out. Files, not signals: they reach a job on any node of a shared
file system, need no process id, and what was asked and answered stays in the run directory
for later. No MPI here.
"""
import json
import os
import time
import uuid

from ..base.errors import ConfigError, InputError
from ..base.files import write_json

DIRECTORY = "control"
COMMANDS = ("status", "add-server", "remove-server", "rebalance", "add-worker",
            "remove-worker")


def _dir(run_dir: str) -> str:
    return os.path.join(run_dir, DIRECTORY)


def submit(run_dir: str, command: str, target: int | None, run_id: str | None) -> str:
    """Write a request to the job `run_id` (the run now holding `run_dir`); its id."""
    if command not in COMMANDS:
        raise ConfigError(f"unknown ctl command {command!r}: one of {', '.join(COMMANDS)}")
    now = time.time_ns()   # ids sort as the requests were made
    ident = (f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now // 10**9))}-"
             f"{now % 10**9:09d}-{uuid.uuid4().hex[:6]}")
    request = {"id": ident, "run_id": run_id, "command": command, "target": target,
               "asked_at": time.time()}
    os.makedirs(_dir(run_dir), exist_ok=True)
    write_json(os.path.join(_dir(run_dir), f"request-{ident}.json"), request)
    return ident


def take(run_dir: str, run_id: str | None) -> dict | None:
    """The lead of run `run_id`: the oldest request not yet taken, marked taken; None if there
    is none. A request that cannot be read, or is for another run, is answered with what was
    wrong (`{"id", "error"}` returned, for the caller to answer)."""
    try:
        names = sorted(n for n in os.listdir(_dir(run_dir))
                       if n.startswith("request-") and n.endswith(".json"))
    except OSError:
        return None
    for name in names:
        ident = name[len("request-"):-len(".json")]
        path = os.path.join(_dir(run_dir), name)
        try:
            os.replace(path, os.path.join(_dir(run_dir), f"taken-{ident}.json"))
            with open(os.path.join(_dir(run_dir), f"taken-{ident}.json")) as f:
                request = json.load(f)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            return {"id": ident, "error": f"{path}: not a request mpips ctl wrote ({e})"}
        problem = _problem(request) or _for_another_run(request, run_id)
        if problem:
            return {"id": ident, "error": f"{path}: {problem}"}
        request["id"] = ident
        return request
    return None


def _problem(request) -> str | None:
    if not isinstance(request, dict):
        return "not a JSON object"
    if request.get("command") not in COMMANDS:
        return f"field 'command' is {request.get('command')!r}, not one of {', '.join(COMMANDS)}"
    target = request.get("target")
    if target is not None and (not isinstance(target, int) or isinstance(target, bool)
                               or target < 0):
        return f"field 'target' is {target!r}, not a server or worker number"
    return None


def _for_another_run(request: dict, run_id: str | None) -> str | None:
    if request.get("run_id") == run_id:
        return None
    return (f"a request for run {request.get('run_id')!r}, not for this run {run_id!r} (left "
            f"from an earlier job in this directory?): discarded, not carried out")


def answer(run_dir: str, ident: str, result: dict) -> None:
    """The lead: the answer to request `ident` (written atomically)."""
    write_json(os.path.join(_dir(run_dir), f"answer-{ident}.json"), {"id": ident, **result})


def wait_answer(run_dir: str, ident: str, timeout: float, running=lambda: True,
                interval: float = 0.1) -> dict:
    """`ctl`: the answer to request `ident`, waited for up to `timeout` seconds while
    `running()` says the job still runs."""
    path = os.path.join(_dir(run_dir), f"answer-{ident}.json")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            pass
        except ValueError as e:
            raise InputError(f"{path}: not an answer mpips wrote ({e})") from None
        if not running():
            raise InputError(f"the job in {run_dir} ended before answering request {ident}")
        if time.monotonic() > deadline:
            taken = os.path.exists(os.path.join(_dir(run_dir), f"taken-{ident}.json"))
            raise InputError(f"no answer to request {ident} within {timeout:g} s (the lead "
                             f"server {'took it' if taken else 'has not taken it yet'}; "
                             f"its answer will be {path})")
        time.sleep(interval)
