"""bench/scale_model.py's model of scale: more network never lowers its throughput, workers
scale it until the servers bind, the bound it names moves as its terms do, shared cores slow
it as they should, and calibration recovers the costs it was given."""
import math
import os
import sys
from dataclasses import replace

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from scale_model import (SPIN_S, Costs, Link, Shape, best_split, bytes_per_example,  # noqa: E402
                         calibrate, ceiling, clock, cluster, examples_per_s, fit_line,
                         link_from_pingpong, shared_finish)

COSTS = Costs(batch=1000, keys_per_batch=8000, keys_s_per_example=4e-7,
              gradient_s_per_example=1e-7, client_s_per_server=30e-6, client_s_per_key=4e-9,
              split_s_per_key=15e-9, server_s_per_worker=90e-6, server_s_per_key=50e-9)
FREE = Link("free", 0.0, math.inf)
HDR = Link("hdr", 1.5e-6, 25e9)
SHAPES = [Shape(1, 1), Shape(2, 2), Shape(4, 16), Shape(16, 4), Shape(100, 900),
          Shape(1, 3, cores=2, per_node=4), Shape(8, 56, per_node=8)]


@pytest.mark.parametrize("shape", SHAPES)
def test_more_bandwidth_or_less_latency_never_lowers_throughput(shape):
    rates = [examples_per_s(COSTS, Link("x", 1e-5, bw), shape) for bw in (1e6, 1e8, 1e10, 1e12)]
    assert rates == sorted(rates)
    rates = [examples_per_s(COSTS, Link("x", lat, 1e9), shape) for lat in (1e-2, 1e-4, 1e-6, 0)]
    assert rates == sorted(rates)
    assert examples_per_s(COSTS, FREE, shape) >= rates[-1]


def test_with_a_free_network_workers_scale_throughput_until_the_servers_bind():
    one = examples_per_s(COSTS, FREE, Shape(4, 1))
    bounds = []
    for workers in range(1, 40):
        shape = Shape(4, workers)
        bound = clock(COSTS, FREE, shape)["bound"]
        rate = examples_per_s(COSTS, FREE, shape)
        if bound == "worker compute":
            assert rate == pytest.approx(workers * one)
        else:
            assert rate < workers * one
        bounds.append(bound)
    assert bounds[0] == "worker compute" and bounds[-1] != "worker compute"
    # once the servers bind, more workers never make it worker-bound again
    first = bounds.index(bounds[-1])
    assert set(bounds[first:]) == {bounds[-1]}


def test_throughput_levels_off_at_the_servers_per_message_work():
    assert ceiling(COSTS) == COSTS.batch / COSTS.server_s_per_worker
    rates = [best_split(COSTS, FREE, nodes)["examples_per_s"] for nodes in (64, 256, 1024)]
    assert rates == sorted(rates)
    assert rates[-1] < ceiling(COSTS)
    assert rates[-1] / rates[-2] < 1.2


@pytest.mark.parametrize("costs, link, shape, bound", [
    (COSTS, FREE, Shape(8, 1), "worker compute"),
    (replace(COSTS, server_s_per_worker=1e-6), FREE, Shape(1, 8), "server per-key work"),
    (COSTS, FREE, Shape(100, 900), "server per-message work"),
    (COSTS, Link("slow", 1e-6, 1e6), Shape(4, 4), "NIC bandwidth"),
    (COSTS, Link("far", 1.0, 25e9), Shape(4, 4), "latency"),
])
def test_the_bound_named_is_the_term_made_largest(costs, link, shape, bound):
    assert clock(costs, link, shape)["bound"] == bound


def test_ranks_beyond_the_cores_share_them_and_never_speed_up():
    assert shared_finish([1.0, 3.0], None) == [1.0, 3.0]
    assert shared_finish([1.0, 3.0], 2) == [1.0, 3.0]
    assert shared_finish([1.0, 1.0], 1) == pytest.approx([2.0, 2.0])
    # a rank whose work ends polls for SPIN_S, taking its share of the core meanwhile
    assert shared_finish([1.0, 3.0], 1) == pytest.approx([2.0, 4.0 + SPIN_S / 2])
    assert shared_finish([1.0], 1, polling=(0.0,)) == pytest.approx([1.0 + SPIN_S / 2])
    assert shared_finish([1.0], 1, polling=(1.0,)) == pytest.approx([1.0])
    for shape in (Shape(1, 2), Shape(2, 1), Shape(1, 3), Shape(2, 2)):
        shared = replace(shape, cores=2, per_node=shape.servers + shape.workers)
        assert examples_per_s(COSTS, HDR, shared) < examples_per_s(COSTS, HDR, shape)


def test_one_node_of_one_core_runs_a_server_and_a_worker_on_it():
    shape = cluster(1, 1, 1)
    assert (shape.servers, shape.workers, shape.cores) == (1, 1, 1)
    assert examples_per_s(COSTS, HDR, shape) < examples_per_s(COSTS, HDR, cluster(2, 1, 1))
    assert cluster(1000, 1, 100) == Shape(100, 900, cores=None, per_node=1)


@pytest.mark.parametrize("nodes", [2, 3, 16, 50])
def test_the_best_split_is_the_best_of_all_splits(nodes):
    best = best_split(COSTS, HDR, nodes)
    every = [examples_per_s(COSTS, HDR, cluster(nodes, 1, s)) for s in range(1, nodes)]
    assert best["servers"] + best["workers"] == nodes
    assert best["examples_per_s"] == max(every)


def test_bytes_per_example_are_a_pull_its_reply_and_a_push_per_key_plus_headers():
    one = bytes_per_example(COSTS, Shape(1, 1))
    assert one == pytest.approx((8000 * (8 + 4 + 4) + 2 * 48 + 64) / 1000)
    assert bytes_per_example(COSTS, Shape(3, 1)) - one == pytest.approx(2 * (2 * 48 + 64) / 1000)


def test_calibration_recovers_the_costs_it_was_measured_from():
    kernels = {"batch": 1000, "keys_per_batch": 8000.0, "keys_s_per_example": 4e-7,
               "gradient_s_per_example": 1e-7, "split_s_per_key": 15e-9}
    probe = [{"keys_per_clock": k, "server_s_per_clock": 90e-6 + k * 50e-9,
              "worker_s_per_clock": 30e-6 + k * 4e-9} for k in (8000, 2000, 250, 31)]
    got = calibrate(kernels, probe)
    for field in ("server_s_per_worker", "server_s_per_key", "client_s_per_server",
                  "client_s_per_key", "keys_s_per_example", "split_s_per_key"):
        assert getattr(got, field) == pytest.approx(getattr(COSTS, field), rel=1e-6), field
    rounds = [{"bytes": b, "seconds": 3 * 2e-6 + b / 10e9} for b in (256, 16_096, 1_600_096)]
    link = link_from_pingpong(rounds)
    assert link.latency_s == pytest.approx(2e-6, rel=1e-6)
    assert link.bandwidth == pytest.approx(10e9, rel=1e-6)


def test_the_per_message_cost_is_that_of_small_messages():
    """A server whose work per key grows a little with the keys (caches: 244 us at 8,382
    keys, as measured here, where a line through the small messages says 230): the fixed
    cost fitted stays within 2% of the true 20 us; a plain least-squares line, pulled by the
    largest point, misses it by more than 4%."""
    keys = [8382, 2094, 264, 33]
    times = [20e-6 + k * 25e-9 + 2e-13 * k * k for k in keys]
    fixed, _ = fit_line(keys, times)
    assert fixed == pytest.approx(20e-6, rel=0.02)
    plain = np.polyfit(keys, times, 1)[1]
    assert abs(plain / 20e-6 - 1) > 0.04
