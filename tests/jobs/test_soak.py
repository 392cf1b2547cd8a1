"""A short soak (bench/soak.py, one trial): a random rank killed or frozen at a random clock in
each job (`--test-event "kill rank R at clock C"`), and none hangs, ends with a wrong or short
model or counts a live rank dead. `python bench/soak.py` runs the long one (20 trials, with
busy processes beside; the suite's own load stands in for them here)."""
import json
import os
import subprocess
import sys

from support import DETECTOR_S

HERE = os.path.dirname(os.path.abspath(__file__))
SOAK = os.path.join(HERE, "..", "..", "bench", "soak.py")


def what_the_ranks_said(work) -> str:
    """The lines of each launch's log but its progress lines: what a failed trial's ranks
    warned of, in order (the soak's own table says only how the trial ended)."""
    said = []
    for log in sorted(work.glob("trial-*.log")):
        with open(log, errors="replace") as f:
            lines = [line for line in f
                     if "] training:" not in line and "] checkpoint at clock" not in line]
        said.append(f"\n--- {log.name}:\n" + "".join(lines[-80:]))
    return "".join(said)


def test_a_short_soak_has_no_hang_and_no_wrong_model(tmp_path):
    proc = subprocess.run([sys.executable, SOAK, "--trials", "1", "--seed", "3",
                           "--epochs", "4", "--detector", str(DETECTOR_S), "--load", "0",
                           "--timeout", "120", "--work", str(tmp_path / "work"),
                           "--out", str(tmp_path / "soak.json")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr + what_the_ranks_said(tmp_path / "work")
    with open(tmp_path / "soak.json") as f:
        result = json.load(f)
    for failure in ("hung", "wrong", "short", "false death", "not killed"):
        assert result["table"][failure] == 0, proc.stdout
    assert len(result["trials"]) == 1
    assert sum(result["table"].values()) == 1
    for trial in result["trials"]:   # each trial acted on the rank it drew, at the clock drawn
        assert trial["acted"] and trial["action"] in ("kill", "freeze"), trial
        assert trial["clock"] >= 1
        with open(tmp_path / "work" / f"trial-{trial['trial']:03d}.log") as f:
            assert (f"test event: {trial['action']} rank {trial['rank']} at clock "
                    f"{trial['clock']} (reached clock {trial['clock']})") in f.read()
