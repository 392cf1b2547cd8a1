"""Pipeline schedules as data: every policy's lists are each stage's tasks once, run without
deadlock under the task DAG, with the textbook bubble; 1F1B holds fewer activations."""
import pytest

from mpips.pipeline.schedule import BACKWARD, FORWARD, POLICIES, Task, bubble, gpipe, needs, one_f_one_b, peak_in_flight, render, simulate

SHAPES = [(1, 1), (1, 4), (2, 1), (2, 4), (3, 2), (3, 8), (4, 3), (4, 16)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("stages, micros", SHAPES)
def test_every_policy_runs_the_dag_with_the_textbook_bubble(policy, stages, micros):
    schedule = POLICIES[policy](stages, micros)
    times = simulate(schedule)   # raises if the lists deadlock or miss a task
    for task, (start, _) in times.items():
        for before in needs(task, stages, micros):
            assert times[before][1] <= start, f"{task} started before {before} ended"
    assert bubble(times, stages) == pytest.approx((stages - 1) / (micros + stages - 1))


@pytest.mark.parametrize("stages, micros", SHAPES)
def test_1f1b_holds_at_most_s_minus_stage_micro_batches_gpipe_all(stages, micros):
    assert peak_in_flight(gpipe(stages, micros)) == [micros] * stages
    assert peak_in_flight(one_f_one_b(stages, micros)) == [min(stages - s, micros)
                                                           for s in range(stages)]


def test_a_backward_before_its_forward_is_a_deadlock_named():
    schedule = gpipe(2, 2)
    schedule[1][0], schedule[1][2] = schedule[1][2], schedule[1][0]   # B0 first on stage 1
    with pytest.raises(ValueError, match="deadlocks: waiting .*B0@1"):
        simulate(schedule)


def test_a_list_missing_a_task_is_refused():
    schedule = gpipe(2, 3)
    schedule[0].remove(Task(0, BACKWARD, 1))
    with pytest.raises(ValueError, match="stage 0: its list is not each of its tasks once"):
        simulate(schedule)


def test_unequal_costs_move_the_bubble_not_the_order():
    # A backward twice a forward's cost, as in most networks.
    times = simulate(one_f_one_b(3, 6), lambda t: {FORWARD: 1.0, BACKWARD: 2.0}.get(t.kind, 0))
    assert max(e for _, e in times.values()) == pytest.approx(3 * 6 + 2 * 3)   # (M+S-1)*(F+B)


def test_the_schedule_prints_one_line_per_stage():
    assert render(one_f_one_b(2, 3)) == ("stage 0: F0 F1 B0 F2 B1 B2  U\n"
                                         "stage 1: F0 B0 F1 B1 F2 B2  U")


@pytest.mark.parametrize("stages, micros", [(0, 1), (2, 0)])
def test_an_empty_pipeline_is_refused(stages, micros):
    with pytest.raises(ValueError, match="at least one stage and one micro-batch"):
        gpipe(stages, micros)


def test_the_command_prints_the_lists_the_bubble_and_the_memory():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "mpips", "schedule", "--stages", "3",
                          "--micro-batches", "5"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "stage 0: F0 F1 F2 B0 F3 B1 F4 B2 B3 B4  U"
    assert lines[3] == ("bubble 28.6% of stage time (theory 28.6%); activations held at most, "
                        "in micro-batches: 3, 2, 1")
    bad = subprocess.run([sys.executable, "-m", "mpips", "schedule", "--stages", "0",
                          "--micro-batches", "5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "at least one stage" in bad.stderr
    assert "Traceback" not in bad.stderr
