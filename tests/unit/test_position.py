"""A worker's Position as a checkpoint's manifest keeps it: a round trip through JSON, the
fields an older manifest lacks, and a damaged one refused naming the worker and the field
(the checkpoint is then passed over, as one whose file is damaged)."""
import json
import math

import pytest

from mpips.storage import checkpoint
from mpips.wire.position import Position

PLACE = Position(clock=40, epoch=1, segment=2, offset=1234, examples=5000, loss=1733.25,
                 finished=False, taken=(0, 1), lost=False)


def test_a_position_comes_back_from_the_manifests_json_as_it_went():
    assert Position.from_dict(json.loads(json.dumps(PLACE.as_dict()))) == PLACE
    lost = PLACE.but(lost=True, finished=True)
    assert Position.from_dict(json.loads(json.dumps(lost.as_dict()))) == lost


def test_fields_an_older_manifest_lacks_take_their_defaults():
    assert Position.from_dict({"clock": 7, "epoch": 0, "offset": 99, "examples": 10,
                               "loss": 3.0}) == Position(7, 0, 0, 99, 10, 3.0)


@pytest.mark.parametrize("field, value, said", [
    ("clock", None, "lacks its clock"),
    ("clock", -1, "clock is -1"),
    ("clock", True, "clock is True"),
    ("epoch", "1", "epoch is '1'"),
    ("segment", 1.5, "segment is 1.5"),
    ("offset", -2, "offset is -2"),
    ("examples", -5, "examples is -5"),
    ("loss", "x", "loss is 'x'"),
    ("loss", -1.0, "loss is -1.0"),
    ("loss", math.inf, "loss is inf"),
    ("taken", [0, -1], "taken is [0, -1]"),
    ("taken", 3, "taken is 3"),
    ("finished", "yes", "finished is 'yes'"),
    ("lost", 1, "lost is 1"),
])
def test_a_damaged_field_is_named(field, value, said):
    d = PLACE.as_dict()
    if value is None:
        del d[field]
    else:
        d[field] = value
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("]", r"\]")):
        Position.from_dict(d)


def test_a_manifest_with_a_damaged_position_is_passed_over_naming_worker_and_field(tmp_path):
    root = str(tmp_path)
    for clock, offset in [(10, 100), (20, "200")]:   # clock 20's offset damaged
        place = dict(PLACE.as_dict(), clock=clock, offset=offset)
        checkpoint.write_manifest(root, clock, [], positions={"0": PLACE.as_dict(), "1": place},
                                  config={})
    newer, older = checkpoint.all_checkpoints(root)
    assert checkpoint.verify(newer) == ("manifest.json: worker 1's position: a position's "
                                        "offset is '200', not an integer >= -1")
    assert checkpoint.verify(older) is None
    directory, manifest = checkpoint.latest_valid(root)
    assert directory == older
    assert checkpoint.read_positions(manifest) == {0: PLACE, 1: PLACE.but(clock=10, offset=100)}


@pytest.mark.parametrize("positions, said", [
    ([], "positions is a list, not a JSON object"),
    ({"w0": PLACE.as_dict()}, "positions names worker 'w0', not a number"),
    ({"0": [40]}, "worker 0's position: a position is a JSON object, not list"),
])
def test_positions_that_are_no_map_of_workers_are_refused(positions, said):
    with pytest.raises(ValueError) as e:
        checkpoint.read_positions({"positions": positions})
    assert str(e.value) == said
