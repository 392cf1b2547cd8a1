"""Converting svmlight-style text or Parquet into binary CSR shards (`python -m mpips
convert`): every converting rank writes one part from its own byte range of the text or
span of Parquet's rows (its arrays go to
scratch .raw files, then each .npy is written atomically, its header ahead of the raw
bytes); rank 0 writes meta.json once every part exists. Reading the shards is `shards`."""
import contextlib
import json
import logging
import os
import re
import shutil

import numpy as np

from ..base.errors import ConfigError
from ..base.files import atomic_file, write_bytes
from ..kernels import distinct
from ..kernels.shapes import FIELD_SHIFT
from ..ranks.bounded import wait_all
from ..ranks.collectives import agree
from .inputs import (
    ARRAYS,
    FIELDS,
    FORMAT,
    check_file,
    check_input,
    data_format,
    is_dataset,
    is_parquet,
    part_file,
)
from .parquet import ParquetShard
from .shards import open_shard
from .textfile import LIBFFM

log = logging.getLogger("mpips")


def write_part(src: str, dst: str, rank: int, size: int, skip_bad: bool) -> dict:
    """Convert part `rank` of `size` of `src` (text or Parquet) into part `rank`."""
    name = f"part-{rank:04d}"
    shard = open_shard(src, rank, size, skip_bad=skip_bad)
    parquet = isinstance(shard, ParquetShard)
    rows = nnz = 0
    top = -1   # libffm: the largest field seen
    keys = distinct.sketch()
    with contextlib.ExitStack() as opened:
        raw = {array: opened.enter_context(open(part_file(dst, name, array) + ".raw", "wb"))
               for array, _ in ARRAYS}
        raw["indptr"].write(np.zeros(1, np.int64).tobytes())
        for chunk in shard.rows():
            distinct.add(keys, chunk.indices)
            raw["labels"].write(chunk.labels.tobytes())
            raw["indptr"].write((chunk.indptr[1:] + nnz).tobytes())
            raw["indices"].write(chunk.indices.tobytes())
            raw["values"].write(chunk.values.tobytes())
            rows += len(chunk)
            nnz += int(chunk.indptr[-1])
            if not parquet and shard.fmt is LIBFFM and chunk.indices.size:
                top = max(top, int((chunk.indices >> FIELD_SHIFT).max()))
    for array, dtype in ARRAYS:   # .npy needs the length up front: the raw bytes go behind it
        npy = part_file(dst, name, array)
        size = os.path.getsize(npy + ".raw")
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                  "fortran_order": False, "shape": (size // np.dtype(dtype).itemsize,)}
        with atomic_file(npy, "wb", tmp=npy + ".tmp", size=size) as out, \
                open(npy + ".raw", "rb") as f:
            np.lib.format.write_array_header_1_0(out, header)
            shutil.copyfileobj(f, out, 64 << 20)
        os.remove(npy + ".raw")
    return {"name": name, "rows": rows, "nnz": nnz, "bad_lines": shard.bad_lines,
            "fields": len(shard.data.fields) if parquet else FIELDS.get(shard.fmt.name, top + 1),
            "keys": keys}


# What `convert` writes in its output directory (and the temporary files on the way): only
# these are removed when --overwrite replaces a converted dataset.
WRITTEN = re.compile(r"meta\.json(\.tmp)?|part-\d{4,}\.(labels|indptr|indices|values)"
                     r"\.npy(\.raw|\.tmp)?")


def remove_dataset(dst: str) -> list:
    """Remove the files `convert` wrote in `dst` (not the directory); returns what else is
    there, which stays."""
    kept = []
    for name in sorted(os.listdir(dst)):
        if WRITTEN.fullmatch(name) and os.path.isfile(os.path.join(dst, name)):
            os.remove(os.path.join(dst, name))
        else:
            kept.append(name)
    return kept


def check_output(dst: str, overwrite: bool) -> None:
    """ConfigError unless `dst` may be written: absent, or (with overwrite) an empty directory
    or a converted dataset. Nothing else is ever deleted."""
    if not os.path.exists(dst):
        return
    if not overwrite:
        raise ConfigError(f"{dst} exists; choose another output, or pass --overwrite")
    if not os.path.isdir(dst) or (os.listdir(dst) and not is_dataset(dst)):
        raise ConfigError(f"{dst} is not a converted dataset: --overwrite replaces only those "
                          f"(a directory with meta.json) or an empty directory")


def convert(src: str, dst: str, comm, skip_bad: bool = False, overwrite: bool = False,
            timeout: float = 3600.0) -> dict | None:
    """Collective over `comm`: every rank converts its byte range of `src`; rank 0 writes
    meta.json once all parts exist. Returns the metadata on rank 0."""
    def check() -> None:
        if is_parquet(src):
            check_input(src, "IN")
        else:
            check_file(src, "IN")
        check_output(dst, overwrite)

    agree(comm, check, timeout)
    if comm.rank == 0:
        if os.path.isdir(dst):
            kept = remove_dataset(dst)
            if kept:
                log.warning("left in place in %s, not written by mpips: %s", dst,
                            ", ".join(kept))
        else:
            os.makedirs(dst)
    wait_all([comm.Ibarrier()], timeout, lambda: "rank 0 to create the output directory")
    part = write_part(src, dst, comm.rank, comm.size, skip_bad)
    counts = np.array([part["rows"], part["nnz"], part["bad_lines"], part["fields"]], np.int64)
    every = np.empty((comm.size, 4), np.int64)
    sketches = np.empty((comm.size, distinct.REGISTERS), np.uint8)
    wait_all([comm.Iallgather(counts, every), comm.Iallgather(part["keys"], sketches)], timeout,
             lambda: "every rank to finish its part")
    if comm.rank != 0:
        return None
    meta = {"format": FORMAT, "version": 1, "source": os.path.abspath(src),
            "text_format": data_format(src),
            "rows": int(every[:, 0].sum()), "nnz": int(every[:, 1].sum()),
            "distinct_keys": distinct.estimate(sketches.max(axis=0)),
            "bad_lines": int(every[:, 2].sum()), "fields": int(every[:, 3].max()),
            "parts": [{"name": f"part-{r:04d}", "rows": int(every[r, 0]), "nnz": int(every[r, 1])}
                      for r in range(comm.size)]}
    write_bytes(os.path.join(dst, "meta.json"), json.dumps(meta, indent=2).encode(),
                tmp=os.path.join(dst, "meta.json.tmp"))
    return meta
