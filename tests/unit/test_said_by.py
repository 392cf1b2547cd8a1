"""An error relayed from rank to rank names its source once (issue 34)."""
from mpips.base.errors import said_by


def test_a_text_is_prefixed_with_its_source():
    assert said_by("worker 1", "bad.svm:3: oops") == "worker 1: bad.svm:3: oops"


def test_a_text_that_names_its_source_already_is_kept():
    named = said_by("worker 1", "bad.svm:3: oops")
    assert said_by("worker 1", named) == named
    assert said_by("worker 1", said_by("worker 1", "worker 1: rows need 2 MiB")) == \
        "worker 1: rows need 2 MiB"


def test_another_source_is_not_taken_for_this_one():
    assert said_by("worker 1", "worker 12: x") == "worker 1: worker 12: x"
    assert said_by("server 0", "worker 1: x") == "server 0: worker 1: x"
