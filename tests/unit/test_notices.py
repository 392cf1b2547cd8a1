"""The fields of a worker's messages that mean something per op, read and made by name."""
import numpy as np
import pytest

from mpips.wire import protocol
from mpips.wire.messages import PlacementAnswer, placement_question, same_keys_push
from mpips.wire.notices import GiveNotice, HandoverNotice, JoinNotice, LeaveNotice, notice_of
from mpips.wire.placement import Placement


def test_the_header_fields_of_a_push_of_a_pulls_keys_and_of_a_placement_question():
    assert protocol.Header(protocol.Op.PUSH, **same_keys_push(7)).arg == 7
    assert protocol.Header(protocol.Op.PLACEMENT, **placement_question(3)).arg == 3


@pytest.mark.parametrize("fields, notice", [
    ([protocol.LEAVE_NOTICE], LeaveNotice()),
    ([protocol.GIVE_NOTICE, 4, 2], GiveNotice(joiner=4, weight=2)),
    ([protocol.JOIN_NOTICE, 9], JoinNotice(clock=9)),
])
def test_notices_are_told_apart(fields, notice):
    assert notice_of(np.array(fields, np.int64)) == notice


def test_a_hand_over_notice_keeps_its_number_and_its_record():
    notice = notice_of(np.array([2, 10, 11, 12], np.int64))
    assert isinstance(notice, HandoverNotice) and notice.number == 2
    assert notice.handover.tolist() == [10, 11, 12]


def test_a_give_notice_without_a_weight_is_no_give_notice():
    assert isinstance(notice_of(np.array([protocol.GIVE_NOTICE, 4, 0], np.int64)),
                      HandoverNotice)


def test_the_placement_answer_of_a_stopped_job_and_of_a_move():
    p = Placement(2, 2)
    buffer = PlacementAnswer.buffer(p)
    buffer[:3] = (0, 5, 0)
    assert not PlacementAnswer.of(buffer, p).moved
    q = p.n_ranges
    buffer[:] = -1
    buffer[:3] = (1, 5, 40)
    buffer[3:3 + q] = np.arange(q) % 2
    answer = PlacementAnswer.of(buffer, p)
    assert answer.moved and (answer.version, answer.clock) == (5, 40)
    assert answer.assign == (np.arange(q) % 2).tolist() and not answer.extra


@pytest.mark.parametrize("notice", [LeaveNotice(), GiveNotice(3, 2), JoinNotice(40),
                                    HandoverNotice(1, np.array([5, 6, 7], np.int64))],
                         ids=lambda n: type(n).__name__)
def test_a_notice_the_lead_sends_reads_back_as_itself(notice):
    back = notice_of(notice.fields())
    assert type(back) is type(notice)
    assert [x.tolist() if isinstance(x, np.ndarray) else x for x in back] == \
        [x.tolist() if isinstance(x, np.ndarray) else x for x in notice]
