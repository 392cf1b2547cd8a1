"""BSP, SSP and ASP under a real straggler, checked from the servers' record of every pull."""
import h5py
import numpy as np
import pytest
from support import read_summary, refusal, run_job

SERVERS, WORKERS, STRAGGLER = 1, 3, 1
# The straggler sleeps 19 times as long as it computes: on a loaded machine the others compute
# slower too (and the straggler's sleeps leave them the cores), so only a wide factor keeps
# it the slowest by far.
SLOWDOWN = 20


def pulls(run_dir):
    """Every pull served, from all servers: worker, clock, slowest, held_s, t, server."""
    parts = []
    for s in range(SERVERS):
        with h5py.File(run_dir / "pulls" / f"server-{s:04d}.h5") as f:
            parts.append({k: f[k][:] for k in ("worker", "clock", "slowest", "held_s", "t")})
            parts[-1]["server"] = np.full(parts[-1]["worker"].shape, s)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def train(small_data, run_dir, *consistency):
    job = run_job(SERVERS + WORKERS, "train", "--train", small_data[0], "--servers", SERVERS,
                  "--out", run_dir, "--batch-size", 200, "--epochs", 1, "--record-pulls",
                  "--straggler", f"{STRAGGLER}:{SLOWDOWN}", *consistency)
    assert job.returncode == 0, job.output
    record = pulls(run_dir)
    training = record["slowest"] >= 0     # reads while the straggler, at least, still trains
    gap = record["clock"][training] - record["slowest"][training]
    # 20,000 rows over 3 workers in minibatches of 200, once: 34 clocks each, on each server.
    assert len(record["worker"]) == SERVERS * WORKERS * 34
    return read_summary(run_dir), record, gap


def test_bsp_moves_in_lockstep(small_data, tmp_path):
    summary, record, gap = train(small_data, tmp_path / "run", "--consistency", "bsp")
    assert (gap == 0).all(), "every read happened at the slowest worker's clock"
    assert (record["held_s"] > 0).any(), "the fast workers were held back"
    assert summary["consistency"] == "bsp" and summary["staleness"] == 0
    assert summary["max_clock_gap"] == 0 and summary["pulls_held"] > 0
    fast = [w for w in range(WORKERS) if w != STRAGGLER]
    assert all(summary["held_s"][w] > 0 for w in fast), "held for the clocks, per the summary"


@pytest.mark.parametrize("staleness", [0, 1, 3])   # s = 0 behaves as BSP
def test_ssp_keeps_the_fastest_within_s_clocks(small_data, tmp_path, staleness):
    summary, record, gap = train(small_data, tmp_path / "run", "--consistency", "ssp",
                                 "--staleness", staleness)
    assert gap.max() == staleness, "never more than s ahead, and the fast workers got that far"
    assert (record["held_s"] > 0).any(), "some reads had to wait"
    # The straggler's reads may wait briefly for the clocks too (how often depends on
    # timing): the fast ones wait for the straggler, which takes twenty times as long.
    held = record["held_s"]
    straggler = record["worker"] == STRAGGLER
    assert held[straggler].sum() < held[~straggler].sum() / 4, "it is the fast ones that wait"
    assert summary["max_clock_gap"] == staleness and summary["staleness"] == staleness


def test_asp_never_waits_for_the_straggler(small_data, tmp_path):
    summary, record, gap = train(small_data, tmp_path / "run", "--consistency", "asp")
    assert (record["held_s"] == 0).all() and summary["pulls_held"] == 0
    assert summary["held_s"] == [0.0] * WORKERS
    assert gap.max() > 10, "the fast workers ran far ahead of the straggler"
    assert summary["staleness"] is None and summary["max_clock_gap"] == gap.max()
    for s in range(SERVERS):   # each fast worker's last read came before the straggler's
        on = record["server"] == s
        last = [record["t"][on & (record["worker"] == w)].max() for w in range(WORKERS)]
        assert max(last[w] for w in range(WORKERS) if w != STRAGGLER) < last[STRAGGLER]
    assert len(summary["wait_s"]) == WORKERS


@pytest.mark.parametrize("args, message", [
    (("--consistency", "ssp"), "--consistency ssp needs --staleness S"),
    (("--staleness", "2"), "--staleness applies to --consistency ssp, not bsp"),
    (("--straggler", "5:3"), "--straggler 5:3.0: worker 5 does not exist (workers are 0..1)"),
    (("--straggler", "0:0.5"), "the factor must be >= 1"),
])
def test_bad_consistency_options(small_data, tmp_path, args, message):
    """Refused by the configuration's check as each rank of a 3-rank job makes it, here in
    this process (tests/hostile/test_options.py launches refusals of this kind under
    mpiexec: every rank stops, the message said once)."""
    status, said = refusal(["--train", small_data[0], "--out", tmp_path / "r", *args], 3)
    assert status == 2 and message in said, said
    assert not (tmp_path / "r").exists()
