"""What a job checks of its inputs before it reads a row, with no numba: what each is (text
of a format, told by its first line; a converted dataset, by its meta.json; or Parquet, by
its first bytes or its *.parquet files), that it is whole and readable, its fields, and
whether test data's format can be scored by a model trained on another's. The readers are
textfile, shards and parquet."""
import json
import os

import numpy as np

from ..base.errors import ConfigError
from ..kernels.shapes import AVAZU_FEATURES, CRITEO_FIELDS

FORMAT = "mpips-csr"   # a converted dataset's (data.shards)
ARRAYS = (("labels", np.float32), ("indptr", np.int64), ("indices", np.uint64),
          ("values", np.float32))
SUFFIX = ".parquet"
MAGIC = b"PAR1"
PARQUET = "parquet"   # what data_format says of Parquet, and a model trained on it keeps
FIELDS = {"criteo": CRITEO_FIELDS, "avazu": AVAZU_FEATURES}   # formats of a fixed field count

# Compressed files by their first bytes: (magic, format, how to decompress keeping the file).
COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip -k"), (b"BZh", "bzip2", "bunzip2 -k"),
              (b"\xfd7zXZ\x00", "xz", "unxz -k"), (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"))


def text_format(path: str) -> str:
    """The name of a text file's format, from its first line: Avazu's is its header ("id,
    click,hour,..."), Criteo's has 39 tabs and no ':'; libffm's first feature has two ':';
    else svmlight."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    first = head.lstrip(b"\r\n").split(b"\n", 1)[0]
    if first.startswith(b"id,click,hour,"):
        return "avazu"
    if criteo_line(first):
        return "criteo"
    tokens = first.split(b"#", 1)[0].split()
    return "libffm" if len(tokens) > 1 and tokens[1].count(b":") == 2 else "svmlight"


def criteo_line(line: bytes) -> bool:
    """Whether a line has Criteo's tabs (and no svmlight feature)."""
    return line.count(b"\t") == CRITEO_FIELDS and b":" not in line


def check_file(path: str, flag: str) -> None:
    """ConfigError unless `path` is a readable, non-empty file."""
    if not os.path.exists(path):
        raise ConfigError(f"{flag} {path}: no such file")
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path}: not a regular file")
    if os.path.getsize(path) == 0:
        raise ConfigError(f"{flag} {path}: the file is empty")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{flag} {path}: not readable")
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, kind, tool in COMPRESSED:
        if head.startswith(magic):
            raise ConfigError(f"{flag} {path}: {kind}-compressed. Workers read byte ranges of "
                              f"plain text in parallel, which a compressed file does not allow: "
                              f"decompress it first ({tool} {path}), then train on it or "
                              f"convert it to binary shards (python -m mpips convert)")


def is_parquet(path: str) -> bool:
    """A file that starts as Parquet files do, or a folder of *.parquet files that is not a
    converted dataset (meta.json)."""
    if os.path.isdir(path):
        return (not os.path.isfile(os.path.join(path, "meta.json"))
                and any(name.endswith(SUFFIX) for name in os.listdir(path)))
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def is_dataset(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "meta.json"))


def read_meta(path: str) -> dict:
    try:
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a converted dataset ({e})") from None
    if meta.get("format") != FORMAT:
        raise ConfigError(f"{path}/meta.json: format is {meta.get('format')!r}, not {FORMAT!r}")
    try:
        for p in meta["parts"]:
            if not (isinstance(p["name"], str) and p["rows"] >= 0 and p["nnz"] >= 0):
                raise ValueError(p)
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{path}/meta.json: its list of parts is damaged") from None
    return meta


def _array_lengths(part: dict) -> dict:
    return {"labels": part["rows"], "indptr": part["rows"] + 1, "indices": part["nnz"],
            "values": part["nnz"]}


def check_parts(path: str, meta: dict) -> None:
    """ConfigError unless every part's arrays are there, of the type and length meta.json
    says, and whole: from the .npy headers and the file sizes, without reading the data."""
    for part in meta["parts"]:
        for array, dtype in ARRAYS:
            name = part_file(path, part["name"], array)
            want = (_array_lengths(part)[array],)
            try:
                with open(name, "rb") as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, fortran, found = read(f)
                    start = f.tell()
                size = os.path.getsize(name)
            except FileNotFoundError:
                raise ConfigError(f"{name}: missing from the dataset") from None
            except (OSError, ValueError) as e:
                raise ConfigError(f"{name}: not a readable .npy file ({e})") from None
            if found != np.dtype(dtype) or shape != want or fortran:
                raise ConfigError(f"{name}: holds {found}{list(shape)}, where meta.json makes it "
                                  f"{np.dtype(dtype)}{list(want)}")
            expected = start + want[0] * np.dtype(dtype).itemsize
            if size != expected:
                how = "truncated" if size < expected else "too long"
                raise ConfigError(f"{name}: {size:,} bytes, where its header makes it "
                                  f"{expected:,} ({how})")


def part_file(path: str, part: str, array: str) -> str:
    return os.path.join(path, f"{part}.{array}.npy")


def check_input(path: str, flag: str, fmt: str | None = None) -> None:
    """ConfigError unless `path` is a readable non-empty text file (of format `fmt`, if
    given: svmlight, criteo or avazu), a whole converted dataset, or Parquet whose schema
    maps to rows."""
    if is_parquet(path):
        from .parquet import ParquetData  # pyarrow's: for Parquet only
        if fmt is not None:
            raise ConfigError(f"{flag} {path}: Parquet, but --format {fmt} names a text "
                              f"format; leave --format out")
        try:
            ParquetData(path)
        except ConfigError as e:
            raise ConfigError(f"{flag} {e}") from None
        return
    if os.path.isdir(path):
        if not is_dataset(path):
            raise ConfigError(f"{flag} {path}: not a converted dataset (no meta.json) nor a "
                              f"folder of Parquet files (no *{SUFFIX}): nothing to read")
        check_parts(path, read_meta(path))
        return
    check_file(path, flag)
    found = text_format(path)
    if fmt is not None and found != fmt:
        raise ConfigError(f"{flag} {path}: --format {fmt}, but its first line is {found} "
                          f"text")


def fields_of(path: str) -> int:
    """How many fields the data's keys carry in their top byte (0: none, as in svmlight):
    Criteo's and Avazu's; a converted dataset's, as counted when converting. libffm text
    says its fields line by line only: 0 here (give --fields). Parquet's: its feature
    columns."""
    try:
        if is_parquet(path):
            from .parquet import ParquetData  # pyarrow's: for Parquet only
            return len(ParquetData(path).fields)
        if os.path.isdir(path):
            return int(read_meta(path).get("fields", 0))
        return FIELDS.get(text_format(path), 0)
    except (OSError, ConfigError):
        return 0   # the checks of the input say what is wrong with it


def data_format(path: str) -> str | None:
    """The format of the data at `path`: a text file's (from its first line), or the text a
    dataset was converted from (None if `convert` did not record it: an older dataset), or
    "parquet"."""
    if is_parquet(path):
        return PARQUET
    if os.path.isdir(path):
        return read_meta(path).get("text_format")
    return text_format(path)


def format_mismatch(test: str, trained: str | None, model: str) -> str | None:
    """Why the data at `test` cannot be scored by `model` (its description), trained on data
    of format `trained`: the formats make different keys of the same features. None if they
    agree or either is not known."""
    found = data_format(test)
    if not (found and trained) or found == trained:
        return None
    return (f"{test} is {found} data, but {model} was trained on {trained} data: their keys "
            f"do not match, and every row would score as if the model knew none of its "
            f"features; give test data in the {trained} format")


