"""The parts of a pipelined job that need no MPI: micro-batch sizes, the bounded log of
tasks, the bubble measured from it, what --print-schedule says."""
import numpy as np
import pytest

from mpips.run.config import DataConfig, ModelConfig, PipelineConfig, TrainConfig
from mpips.base.errors import ConfigError
from mpips.pipeline.stage_rank import TASK_RECORD
from mpips.pipeline.schedule import logged_bubbles
from mpips.job.stage_part import TaskLog, describe_pipeline, micro_rows


def test_micro_batches_split_a_minibatch_evenly_and_never_empty():
    assert micro_rows(10, 4) == [3, 3, 2, 2]
    assert micro_rows(3, 8) == [1, 1, 1]
    assert sum(micro_rows(1001, 7)) == 1001


def test_the_log_keeps_the_first_and_the_latest_steps():
    log = TaskLog(worker=3, first=2, last=3)
    for clock in range(10):
        records = np.array([(0, b"F", 0, 0.5, 1.0), (0, b"U", -1, 1.0, 1.25)], TASK_RECORD)
        log.add(clock, 100.0 + clock, records)
    rows = log.rows()
    assert sorted(set(rows["clock"].tolist())) == [0, 1, 7, 8, 9]
    assert (rows["worker"] == 3).all() and rows.shape[0] == 10
    first = rows[rows["clock"] == 7]
    assert list(first["start"]) == [107.5, 108.0] and list(first["end"]) == [108.0, 108.25]
    assert TaskLog(0).rows().shape == (0,)


def test_the_bubble_of_each_logged_step_of_each_copy():
    # Copy 0 (workers 0, 1), clock 5: stage 0 busy 0-1 and 2-3, stage 1 busy 1-2: span 3,
    # busy 3 of 6 -> 0.5. Copy 1 (workers 2, 3), same clock: both busy 0-2 -> 0.
    worker = np.array([0, 0, 1, 2, 3])
    clock = np.full(5, 5)
    start = np.array([0.0, 2.0, 1.0, 0.0, 0.0])
    end = np.array([1.0, 3.0, 2.0, 2.0, 2.0])
    assert logged_bubbles(worker, clock, start, end, 2) == [0.5, 0.0]


def test_print_schedule_describes_the_cut_and_refuses_other_models():
    cfg = TrainConfig(data=DataConfig(train="x"),
                      model=ModelConfig(name="widedeep", hidden=(64, 32)),
                      pipeline=PipelineConfig(stages=2, micro_batches=4))
    text = describe_pipeline(cfg)
    assert "dense 8x64 relu -> dense 64x32 relu -> dense 32x1 identity" in text
    assert text.count("stage 0:") == 2 and "and the embeddings" in text
    assert "bubble 20.0% of stage time (theory 20.0%)" in text
    with pytest.raises(ConfigError, match="needs --model widedeep"):
        describe_pipeline(TrainConfig(data=DataConfig(train="x"),
                                      pipeline=PipelineConfig(stages=2)))
    with pytest.raises(ConfigError, match="the network has 3 layers"):
        describe_pipeline(TrainConfig(data=DataConfig(train="x"),
                                      model=ModelConfig(name="widedeep"),
                                      pipeline=PipelineConfig(stages=4)))
