"""A network split by layers over 2 and 3 ranks, run as a pipeline (GPipe and 1F1B): every
stage's weights after a few steps are bit for bit those of the same schedule played in one
process (network.run_step, itself checked against a whole-batch step in
tests/unit/test_network.py). Run with mpiexec -n 4 python -m pytest --with-mpi tests/mpi."""
import numpy as np
import pytest
from mpi4py import MPI

from mpips.models.network import init, mlp, partition, stages_of
from mpips.pipeline.stage_rank import BadStageMessage, StageRank
from mpips.pipeline.inprocess import run_step
from mpips.pipeline.schedule import POLICIES

pytestmark = pytest.mark.mpi(min_size=3)
STEPS = 3


def data(n, inputs):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(n, inputs))
    return x, (x[:, 0] * x[:, 1] > 0).astype(np.float64)


@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("stages, micros", [(2, 1), (2, 4), (3, 3), (3, 5)])
def test_a_pipeline_over_ranks_ends_on_the_in_process_bits(policy, stages, micros):
    world = MPI.COMM_WORLD
    comm = world.Split(0 if world.rank < stages else MPI.UNDEFINED, world.rank)
    if comm == MPI.COMM_NULL:
        return
    try:
        layers = mlp(10, [12, 9, 6, 5])
        x, labels = data(53, 10)   # micro-batches of unequal rows
        cuts = partition([layer.cost for layer in layers], stages)
        schedule = POLICIES[policy](stages, micros)
        alone = stages_of(layers, init(layers, 9), cuts, micros)
        piped_weights = init(layers, 9)
        mine = stages_of(layers, piped_weights, cuts, micros)[comm.rank]
        first = cuts[comm.rank].start
        rank = StageRank(comm, mine, layers[first].inputs, timeout=60)
        rows = [p.shape[0] for p in np.array_split(np.arange(53), micros)]
        for _ in range(STEPS):
            expected = run_step(alone, schedule, x, labels, 0.4)
            loss, record = rank.step(schedule[comm.rank], rows, x if comm.rank == 0 else None,
                                     labels if mine.last else None, 0.4)
            if mine.last:
                assert loss == expected
        for (w, b), (w_alone, b_alone) in zip(mine.weights, alone[comm.rank].weights):
            assert np.array_equal(w, w_alone) and np.array_equal(b, b_alone)
        assert len(record) == 2 * micros + 1 and (record["end"] >= record["start"]).all()
        assert [r.decode() for r in record["kind"]] == [t.kind for t in schedule[comm.rank]]
    finally:
        comm.Free()


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_two_copies_of_a_two_stage_pipeline_keep_one_model(policy):
    """D=2 copies x S=2 stages on 4 ranks, each copy half the rows: the copies' weights are
    the same bits, and within 1e-10 of one pipeline over all the rows."""
    world = MPI.COMM_WORLD
    inside = world.rank < 4
    pipe = world.Split(world.rank // 2 if inside else MPI.UNDEFINED, world.rank)
    copies = world.Split(world.rank % 2 if inside else MPI.UNDEFINED, world.rank)
    if not inside:
        return
    try:
        copy, stage_index, micros = world.rank // 2, world.rank % 2, 3
        layers = mlp(10, [12, 9, 6])
        x, labels = data(60, 10)
        mine_rows = np.arange(copy * 30, (copy + 1) * 30)
        cuts = partition([layer.cost for layer in layers], 2)
        weights = init(layers, 4)
        mine = stages_of(layers, weights, cuts, micros)[stage_index]
        rank = StageRank(pipe, mine, layers[cuts[stage_index].start].inputs, 60, copies)
        whole = stages_of(layers, init(layers, 4), cuts, 2 * micros)
        rows = [p.shape[0] for p in np.array_split(np.arange(30), micros)]
        for _ in range(STEPS):
            run_step(whole, POLICIES[policy](2, 2 * micros), x, labels, 0.4)
            rank.step(POLICIES[policy](2, micros)[stage_index], rows,
                      x[mine_rows] if stage_index == 0 else None,
                      labels[mine_rows] if mine.last else None, 0.4)
        flat = np.concatenate([a.ravel() for wb in mine.weights for a in wb])
        other = np.empty_like(flat)
        copies.Sendrecv(flat, 1 - copy, recvbuf=other, source=1 - copy)
        assert np.array_equal(flat, other), "the copies drifted apart"
        for (w, b), (w1, b1) in zip(mine.weights, whole[stage_index].weights):
            np.testing.assert_allclose(w, w1, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(b, b1, rtol=1e-10, atol=1e-12)
    finally:
        pipe.Free()
        copies.Free()


@pytest.mark.parametrize("extra", [1, -1], ids=["longer", "shorter"])
def test_a_stage_message_of_the_wrong_size_is_refused_naming_it(extra):
    """A forged (or mismatched) activation message: the receiving stage stops with the
    message named, never reads past its buffer or trains on part of one."""
    world = MPI.COMM_WORLD
    comm = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
    if comm == MPI.COMM_NULL:
        return
    try:
        layers = mlp(4, [3])
        stage = stages_of(layers, init(layers, 1), partition([1, 1], 2), 1)[comm.rank]
        if comm.rank == 0:   # sends micro-batch 0's activations with a wrong width
            comm.Send(np.zeros((5, 3 + extra)), 1, tag=0)
        else:
            rank = StageRank(comm, stage, 3, timeout=30)
            with pytest.raises(BadStageMessage, match="the activations of micro-batch 0 from "
                                                      "stage 0: .* of shape \\(5, 3\\) expected"):
                rank.step(POLICIES["gpipe"](2, 1)[1], [5], None, np.zeros(5), 0.1)
    finally:
        comm.Free()
