"""The Avazu CSV reader (kernels.avazu through data.TextShard): the header passed over, the
id ignored, the hour as hour of day and weekday, every other value a key of its column;
bad lines named by file and line. The sample lines follow the published column layout."""
import numpy as np
import pytest

from mpips.data.textfile import AVAZU, TextShard, sniff
from mpips.base.errors import InputError
from mpips.kernels.avazu import feature_key, weekday

HEADER = ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
          "app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,"
          "C15,C16,C17,C18,C19,C20,C21\n")
LINE = ("1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,"
        "07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79\n")


def read(tmp_path, text: str, **options):
    path = tmp_path / "train.csv"
    path.write_text(text)
    return str(path), list(TextShard(str(path), **options).rows())


def test_the_hour_is_two_features_and_every_other_value_a_key_of_its_column(tmp_path):
    path, [rows] = read(tmp_path, HEADER + LINE + LINE.replace(",0,1410", ",1,1410"))
    assert sniff(path) is AVAZU
    assert rows.labels.tolist() == [0.0, 1.0]
    assert np.diff(rows.indptr).tolist() == [23, 23]
    assert int(rows.indices[0]) == int(feature_key(0, 0))               # 00h
    assert int(rows.indices[1]) == int(feature_key(1, weekday(14, 10, 21)))
    assert len(set(rows.indices[:23].tolist())) == 23
    assert (rows.indices[:23] >> np.uint64(56)).tolist() == list(range(23))   # the fields


def test_weekdays_are_the_calendars():
    assert weekday(14, 10, 21) == 1     # 2014-10-21 was a Tuesday
    assert weekday(0, 3, 1) == 2        # 2000-03-01, a Wednesday
    assert weekday(24, 2, 29) == 3      # 2024-02-29, a Thursday


@pytest.mark.parametrize("line, says", [
    (LINE.replace(",0,1410", ",2,1410"), "click must be 0 or 1"),
    (LINE.replace("14102100", "141021"), "hour must be YYMMDDHH"),
    (LINE.replace(",79\n", "\n"), "expected 24 comma-separated columns"),
    (LINE.replace(",79\n", ",79,5\n"), "expected 24 comma-separated columns"),
], ids=["click", "hour", "too few", "too many"])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, says):
    with pytest.raises(InputError) as e:
        read(tmp_path, HEADER + LINE + line)
    assert "train.csv:3: " + says in str(e.value)
    _, rows = read(tmp_path, HEADER + line + LINE, skip_bad=True, log_bad=False)
    assert sum(len(r) for r in rows) == 1
