"""The C entries run/ahead_natives writes: which forms get one, and how each passes its
arguments (the entries' behaviour is tested on the build in test_ahead)."""
from mpips.run.ahead_natives import entries, entry, has_entry

ARRAY_F4_2D = "00660452"   # float32, 2 dimensions, C-contiguous, writeable
ARRAY_U1_1D = "00750151"
INT64, FLOAT64, FLOAT32, BOOL = "01690800", "01660800", "01660400", "01620100"


def test_forms_whose_result_is_a_scalar_or_none_get_an_entry():
    for result in ("none", "int64", "uint64", "float64", "bool"):
        assert has_entry(ARRAY_U1_1D + INT64 + FLOAT64 + BOOL, result)
    for result in ("UniTuple(int64, 2)", "Array(uint64, 1, 'C', False, aligned=True)"):
        assert not has_entry(ARRAY_U1_1D, result), "numba's wrapper boxes those"
    assert not has_entry(ARRAY_U1_1D + FLOAT32, "none"), "a scalar kind it cannot read"


def test_an_array_passes_its_records_fields_and_a_scalar_its_value():
    source = entry(3, ARRAY_F4_2D + INT64 + BOOL, "int64")
    assert "entry_3(void *native, PyObject *const *args)" in source
    call = source[source.index("native)(") + len("native)("):]
    fields = [f.strip() for f in call[:call.index(");")].split(",")]
    a = "((PyArrayObject *)args[0])"
    assert fields == ["&ret", "&exc", "NULL", "NULL", f"PyArray_SIZE({a})",
                      f"PyArray_ITEMSIZE({a})", f"PyArray_DATA({a})", f"PyArray_DIM({a}", "0)",
                      f"PyArray_DIM({a}", "1)", f"PyArray_STRIDE({a}", "0)",
                      f"PyArray_STRIDE({a}", "1)", "s1", "s2"]
    assert "int64_t s1 = PyLong_AsLongLong(args[1]);" in source
    assert "status != 0 && status != -2" in source   # numba's: OK, or None returned


def test_the_table_lists_every_entry_in_order():
    source = entries([(INT64, "none"), (ARRAY_U1_1D, "bool")])
    assert "entry_0,\n    entry_1,\n    NULL," in source
    assert "mpips_entry_count = 2;" in source
