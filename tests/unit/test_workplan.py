"""The work plan: after deaths, every row is still trained once per epoch, by someone."""
import itertools

import numpy as np
import pytest

from mpips.data.workplan import Handover, WorkPlan

PARTS = [(0, 100), (100, 200), (200, 307), (307, 400)]
EPOCHS = 3


def counts(plan: WorkPlan, takes: dict) -> np.ndarray:
    """counts[epoch, row]: how many times each row is trained in each epoch, over every
    worker's plan (`takes[w]`: the epochs at which w took its shares)."""
    out = np.zeros((EPOCHS, PARTS[-1][1]), np.int64)
    for w in range(len(PARTS)):
        for e, ranges in enumerate(plan.plan(w, takes.get(w, ()))):
            for a, b in ranges:
                out[e, a:b] += 1
    return out


def test_without_deaths_each_worker_trains_its_own_part():
    plan = WorkPlan(PARTS, EPOCHS)
    assert all(plan.segments(w, e) == [PARTS[w]] for w in range(4) for e in range(EPOCHS))
    assert (counts(plan, {}) == 1).all()


@pytest.mark.parametrize("epoch, segment, offset", [(0, 0, 150), (1, 0, -1), (2, 0, 199),
                                                     (0, 0, 100)])
def test_a_death_hands_the_rest_to_the_survivors_once(epoch, segment, offset):
    plan = WorkPlan(PARTS, EPOCHS).with_death(Handover(1, 7, epoch, segment, offset,
                                                    survivors=(0, 2, 3)))
    takes = {w: [epoch] for w in (0, 2, 3)}
    assert (counts(plan, takes) == 1).all()
    assert plan.segments(0, epoch, [epoch])[0] == PARTS[0], "its own part comes first"
    left = sum(b - a for w in (0, 2, 3) for e in range(EPOCHS)
               for a, b in plan.segments(w, e, takes[w])[1:])
    start = 100 if offset < 0 else offset
    assert left == (200 - start) + 100 * (EPOCHS - 1 - epoch)


def test_a_survivor_ahead_takes_the_rest_into_its_current_epoch():
    """Worker 3 was already in epoch 2 when worker 1 died in epoch 0: what worker 1 had left
    of epochs 0 and 1 goes to worker 3's epoch 2; nothing goes to an epoch it has passed."""
    plan = WorkPlan(PARTS, EPOCHS).with_death(Handover(1, 7, 0, 0, 150, survivors=(0, 3)))
    takes = {0: [0], 3: [2]}
    assert (counts(plan, takes).sum(axis=0) == EPOCHS).all(), "every row once per epoch"
    assert len(plan.segments(3, 0, [2])) == len(plan.segments(3, 1, [2])) == 1
    assert len(plan.segments(3, 2, [2])) == 4   # its own, then epochs 0, 1 and 2 of worker 1
    assert plan.segments(3, 2, ())[1:] == [], "not taken yet: not in its plan"


def test_a_second_death_hands_on_the_share_of_the_first():
    first = Handover(1, 7, 0, 0, 150, survivors=(0, 2, 3))
    # Worker 2 took its share in epoch 0 and died in epoch 1, in its second segment.
    second = Handover(2, 40, 1, 1, first.piece(100, 200, 2)[0] + 5, taken=(0,), survivors=(0, 3))
    plan = WorkPlan(PARTS, EPOCHS).with_death(first).with_death(second)
    takes = {0: [0, 1], 3: [0, 1]}
    assert (counts(plan, takes) == 1).all()
    assert plan.shares(0) == [0, 1] and plan.shares(2) == [0]
    trained_by_2 = plan.plan(2, (0,))
    assert trained_by_2[2] == [] and len(trained_by_2[1]) == 2, "cut where it died"


def test_a_death_after_its_last_epoch_moves_nothing():
    plan = WorkPlan(PARTS, EPOCHS).with_death(Handover(1, 70, EPOCHS, 0, -1, survivors=(0,)))
    assert (counts(plan, {0: [EPOCHS - 1]}) == 1).all()
    assert plan.segments(0, EPOCHS - 1, [EPOCHS - 1]) == [PARTS[0]]


def test_deaths_round_trip_through_json_fields():
    d = Handover(1, 7, 0, 2, 150, taken=(0, 1), survivors=(0, 3))
    assert Handover.from_dict(d.as_dict()) == d


def test_random_deaths_keep_every_row_once_per_epoch():
    rng = np.random.default_rng(0)
    for trial in range(200):
        plan, living, takes = WorkPlan(PARTS, EPOCHS), [0, 1, 2, 3], {w: [] for w in range(4)}
        for _ in range(rng.integers(1, 4)):
            dead = int(rng.choice(living))
            living.remove(dead)
            epoch = int(rng.integers(0, EPOCHS + 1))
            mine = plan.plan(dead, takes[dead])
            segment = int(rng.integers(0, len(mine[epoch]))) if epoch < EPOCHS else 0
            ranges = mine[epoch] if epoch < EPOCHS else []
            offset = (int(rng.integers(ranges[segment][0], ranges[segment][1] + 1))
                      if ranges else -1)
            plan = plan.with_death(Handover(dead, 0, epoch, segment, offset, tuple(takes[dead]),
                                         tuple(living)))
            for w in living:
                takes[w].append(max(epoch if epoch < EPOCHS else EPOCHS - 1,
                                     max(takes[w], default=0)))
        c = counts(plan, takes)
        assert (c.sum(axis=0) == EPOCHS).all(), trial
        assert c.min() >= 0 and list(itertools.chain(*[plan.shares(w) for w in living]))


def test_a_worker_that_left_and_joins_again_takes_a_piece_of_every_workers_rest():
    """Worker 1 leaves in epoch 0; in epoch 1 it joins again: workers 0, 2 and 3 each keep
    three quarters of what they have left and give it the last quarter."""
    left = Handover(1, 7, 0, 0, 150, survivors=(0, 2, 3), dead=False)
    plan = WorkPlan(PARTS, EPOCHS).with_death(left)
    takes = {0: [0], 2: [0], 3: [0]}
    assert (counts(plan, takes).sum(axis=0) == EPOCHS).all()
    for donor in (0, 2, 3):   # each cuts where it stands: its own part, 40 rows in
        start = PARTS[donor][0]
        plan = plan.with_death(Handover(donor, 30, 1, 0, start + 40, tuple(takes[donor]),
                                     survivors=(donor, 1), shares=(3, 1), dead=False))
        takes[donor].append(1)
        takes.setdefault(1, []).append(1)
    c = counts(plan, takes)
    assert (c.sum(axis=0) == EPOCHS).all(), "every row once per epoch"
    mine = plan.segments(1, 1, takes[1])
    assert mine[0] == (85, 100) and len(mine) == 6, "a quarter of both ranges of each donor"
    kept = plan.segments(0, 1, takes[0])
    assert kept[0] == (0, 40) and kept[1] == (40, 85), "worker 0 trained 40 rows, keeps 3/4"
    assert plan.segments(0, 2, takes[0])[0] == (0, 75), "and 3/4 of each later epoch"


def test_a_split_round_trips_through_the_wire_and_json():
    d = Handover(2, 30, 1, 1, 250, taken=(0, 1), survivors=(2, 1), shares=(3, 1), dead=False)
    assert Handover.of_fields(d.fields()) == d
    assert Handover.from_dict(d.as_dict()) == d
    with pytest.raises(ValueError):
        Handover.of_fields(d.fields()[:-1])   # a share missing


def test_random_deaths_leaves_and_joins_keep_every_row_once_per_epoch():
    rng = np.random.default_rng(1)
    for trial in range(300):
        plan, training, gone = WorkPlan(PARTS, EPOCHS), [0, 1, 2, 3], []
        takes = {w: [] for w in range(4)}

        def place(w):
            epoch = int(rng.integers(max(takes[w], default=0), EPOCHS + 1))
            mine = plan.plan(w, takes[w])
            if epoch == EPOCHS or not mine[epoch]:
                return min(epoch, EPOCHS), 0, -1
            segment = int(rng.integers(0, len(mine[epoch])))
            a, b = mine[epoch][segment]
            return epoch, segment, int(rng.integers(a, b + 1))

        def take(w, epoch):
            takes[w].append(max(min(epoch, EPOCHS - 1), max(takes[w], default=0)))

        for _ in range(rng.integers(1, 6)):
            kind = rng.choice(["die", "leave", "join"] if gone else ["die", "leave"])
            if kind == "join":
                joiner = gone.pop(0)
                for donor in list(training):
                    where = place(donor)
                    plan = plan.with_death(Handover(donor, 0, *where, tuple(takes[donor]),
                                                 (donor, joiner), False,
                                                 (len(training), 1)))
                    take(donor, where[0])
                    take(joiner, where[0])
                training.append(joiner)
                continue
            if len(training) < 2:
                continue
            w = int(rng.choice(training))
            training.remove(w)
            where = place(w)
            plan = plan.with_death(Handover(w, 0, *where, tuple(takes[w]), tuple(training),
                                         kind == "die"))
            for s in training:
                take(s, where[0])
            if kind == "leave":
                gone.append(w)
        c = counts(plan, takes)
        assert (c.sum(axis=0) == EPOCHS).all(), trial
