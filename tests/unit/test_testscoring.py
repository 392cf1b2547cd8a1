"""The lead's hand-out of the test file in chunks (testscoring.Chunks, and under ULFM
HandOut; pure) and the checks of a chunk handed out (HeldOutFile.chunk)."""
from types import SimpleNamespace

import pytest

from mpips.base.errors import InputError, ProtocolError
from mpips.job.chunks import NONE, SMALLEST, Asked, Chunks, HandOut, HeldOutFile


def handed_out(chunks: Chunks, small=()) -> list:
    """Every chunk until none is left; the i-th taken small if i is in `small`."""
    out = []
    while True:
        start, stop = chunks.take(len(out) in small)
        if start == stop:
            return out
        out.append((start, stop))


@pytest.mark.parametrize("total", [1, 7, 9999, 10000, 123457, 400000])
@pytest.mark.parametrize("ranks", [1, 2, 4, 64])
@pytest.mark.parametrize("multiple", [1, 10000])
def test_chunks_cover_the_file_once_large_first(total, ranks, multiple):
    chunks = handed_out(Chunks(total, ranks, multiple))
    assert chunks[0][0] == 0 and chunks[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))   # no gap, no overlap
    sizes = [stop - start for start, stop in chunks]
    assert all(s > 0 for s in sizes)
    assert all(s % multiple == 0 for s in sizes[:-1])             # whole batches but the last
    assert all(a >= b for a, b in zip(sizes[:-2], sizes[1:-1]))   # guided: never growing
    # Few: a share over 2 ranks at first, then at least 1/SMALLEST of a rank's share.
    assert len(chunks) <= 2 * ranks * (SMALLEST + 4)
    assert Chunks(total, ranks, multiple).take()[1] >= min(total, total // (2 * ranks))


def test_an_empty_file_has_no_chunk_and_the_end_is_said_again():
    chunks = Chunks(0, 3)
    assert chunks.take() == (0, 0) and chunks.take(True) == (0, 0)
    full = Chunks(10, 1)
    handed_out(full)
    assert full.take() == (10, 10)


def test_a_small_chunk_is_the_smallest_size_wherever_it_is_taken():
    chunks = Chunks(400000, 4, 1)
    assert chunks.take(True) == (0, chunks.smallest)
    assert chunks.take()[1] - chunks.smallest > chunks.smallest   # a large one after it
    everything = handed_out(Chunks(400000, 4, 1), small={0, 2, 4})
    assert everything[-1][1] == 400000


@pytest.fixture
def test_file(tmp_path):
    path = tmp_path / "test.svm"
    path.write_text("".join(f"{i % 2} {i}:1 {i + 7}:0.5\n" for i in range(50)))
    return HeldOutFile(SimpleNamespace(data=SimpleNamespace(test=str(path), skip_bad_lines=False)))


def test_a_chunk_handed_out_is_read_as_the_lines_that_start_in_it(test_file):
    rows = [test_file.chunk(span, "the lead server") for span in handed_out(
        test_file.chunks(3))]
    labels = [int(x) for shard in rows for batch in shard.minibatches(7) for x in batch.labels]
    assert labels == [i % 2 for i in range(50)]
    assert test_file.chunk((test_file.total, test_file.total), "the lead server") is None


@pytest.mark.parametrize("span", [(-1, 5), (5, 4), (0, 10 ** 9)])
def test_a_chunk_outside_the_file_is_refused_naming_who_handed_it_out(test_file, span):
    with pytest.raises(ProtocolError, match=r"the lead server handed out chunk .* of the test "
                                            r"file .*test.svm, which has \d+ bytes"):
        test_file.chunk(span, "the lead server")


def test_a_missing_test_file_names_it(tmp_path):
    with pytest.raises(InputError, match="--test .*gone.svm"):
        HeldOutFile(SimpleNamespace(data=SimpleNamespace(test=str(tmp_path / "gone.svm"),
                                                         skip_bad_lines=False)))


def test_bad_lines_in_chunks_are_numbered_right_and_said_five_times_in_all(tmp_path, caplog):
    """--skip-bad-lines: a chunk's first bad line is numbered from the nearest line number
    known (not by reading the file from its start again), and the chunks of one file share
    the budget of five warnings."""
    path = tmp_path / "test.svm"
    bad = {3, 40, 41, 77, 120, 160, 199}
    path.write_text("".join("1 this:is:bad\n" if i in bad else f"{i % 2} {i}:1\n"
                            for i in range(1, 201)))
    test = HeldOutFile(SimpleNamespace(data=SimpleNamespace(test=str(path), skip_bad_lines=True)))
    with caplog.at_level("WARNING", logger="mpips"):
        rows = 0
        skipped = 0
        for span in handed_out(test.chunks(6)):
            shard = test.chunk(span, "the lead server")
            rows += sum(len(batch) for batch in shard.minibatches(16))
            skipped += shard.bad_lines
    said = [r.getMessage() for r in caplog.records if "skipping bad line" in r.getMessage()]
    assert rows == 200 - len(bad) and skipped == len(bad)
    assert len(said) == 5
    numbers = [int(m.split(f"{path}:")[1].split(":")[0]) for m in said]
    assert set(numbers) <= bad, numbers



def test_under_ulfm_a_dead_workers_chunks_go_to_others_and_none_is_said_once_all_ask():
    """Worker 1 dies holding two chunks: they go to the next that ask; "none left" comes
    only once every living worker asks, so each chunk is scored once by a living one."""
    hand = HandOut(Chunks(100, 2))
    scored = {0: [], 1: []}

    def ask(worker, living=frozenset({0, 1})):
        hand.asking[worker] = Asked(source=10 + worker, ts=0)
        answers = hand.answers(set(living))
        for asked, span in answers:
            if span != NONE:
                scored[asked.source - 10].append(span)
        return answers

    while hand.chunks.taken < hand.chunks.total:
        ask(1 if len(scored[1]) < 2 else 0)
    assert len(scored[1]) == 2
    assert ask(0) == [], "worker 1 might still die: worker 0 is not told that none is left"
    assert hand.worker_died(1) == 2
    died_with_1 = scored.pop(1)
    answers = hand.answers({0})
    assert [span for _, span in answers] == [died_with_1[0]], "worker 0, asking, gets one"
    scored[0].append(died_with_1[0])
    assert [span for _, span in ask(0, {0})] == [died_with_1[1]]
    assert [span for _, span in ask(0, {0})] == [NONE]
    assert sorted(scored[0])[0][0] == 0 and sum(b - a for a, b in scored[0]) == 100
