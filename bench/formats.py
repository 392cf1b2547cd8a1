"""Parse rate of each text format on one core, beside a plain read of the same file: Criteo
TSV and svmlight, the same number of rows with about the same features per row.

    python bench/formats.py [--rows 300000] [--repeats 3]

Data (made once in bench/data/formats/, `mpips make-data`): Criteo layout (39 fields, ~15%
empty) and svmlight rows of 33 hashed features (the Criteo rows' mean), whose keys are
make-data's 64-bit hashes: up to 20 decimal digits each, 19 or 20 for nine in ten. For each
file, the best of `--repeats` runs of:

  read    the file into a numpy buffer in TextShard's chunks (f.readinto, from the page
          cache): the speed of memory, what a parser could approach
  kernel  data.TextParser on those chunks already in memory: the parse alone
  pass    TextShard.rows, reading and parsing: what training and convert do

Prints MB/s and rows/s of each and its share of the read's rate. Then the Criteo rows as
each kind of input a worker reads, side by side in rows/s (a pass of minibatches of 10,000
rows, each batch's keys touched):

  text     the Criteo TSV (TextShard)
  shards   its conversion (`mpips convert`, CsrShard: memory-mapped, no parsing)
  parquet  the same rows as Parquet (row groups of 65,536 rows, snappy; the 13 integer
           columns int64, the 26 categorical ones strings, as a table would hold them),
           read by ParquetShard; `parquet_decode` is pyarrow's reading of the row groups
           alone (the strings as dictionaries, as ParquetShard reads them), what the
           mapping to keys adds to

Writes bench/results/formats.json.
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import checkout  # noqa: E402,F401  (this checkout's mpips: see checkout.py)
from report import save  # noqa: E402

from mpips.data.shards import open_shard  # noqa: E402
from mpips.data.textfile import TextParser, TextShard, sniff  # noqa: E402

BATCH = 10000
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl": "^ofi", "OMPI_MCA_osc": "^ucx"}


def dataset(fmt: str, rows: int) -> str:
    prefix = os.path.join(HERE, "data", "formats", f"{fmt}-{rows}")
    path = f"{prefix}.train.{'tsv' if fmt == 'criteo' else 'svm'}"
    if not os.path.exists(path):
        extra = ["--format", "criteo"] if fmt == "criteo" else ["--nnz", "33"]
        subprocess.run([sys.executable, "-m", "mpips", "make-data", "--rows", str(rows),
                        "--test-rows", "1", "--features", "1000000", *extra, prefix],
                       check=True, capture_output=True)
    return path


def read(path: str, chunk_bytes: int) -> None:
    """Read the file chunk by chunk and nothing else."""
    buf = np.empty(chunk_bytes, np.uint8)
    with open(path, "rb") as f:
        while f.readinto(memoryview(buf)):
            pass


def kernel(path: str, text: np.ndarray, chunk_bytes: int) -> tuple[int, int]:
    """(rows, features) parsed from `text`, the file in memory, chunk by chunk."""
    parse = TextParser(sniff(path), skip_bad=False)
    rows = nnz = pos = 0
    while pos < text.shape[0]:
        final = pos + chunk_bytes >= text.shape[0]
        chunk, used, *_ = parse(text[pos:pos + chunk_bytes], final)
        if used == 0 and not final:
            raise ValueError(f"{path}: a line longer than {chunk_bytes} bytes")
        if chunk is not None:
            rows += len(chunk)
            nnz += chunk.indices.shape[0]
        pos += used
    return rows, nnz


def whole_pass(path: str) -> tuple[int, int]:
    """(rows, features) of a TextShard pass over the file."""
    rows = nnz = 0
    for chunk in TextShard(path).rows():
        rows += len(chunk)
        nnz += chunk.indices.shape[0]
    return rows, nnz


def best(run, repeats: int) -> float:
    """Seconds of the fastest of `repeats` runs, after one to warm up."""
    run()
    seconds = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        seconds = min(seconds, time.perf_counter() - start)
    return seconds


def rates(path: str, repeats: int) -> dict:
    size = os.path.getsize(path)
    chunk_bytes = TextShard(path).chunk_bytes
    text = np.fromfile(path, np.uint8)
    rows, nnz = whole_pass(path)
    if kernel(path, text, chunk_bytes) != (rows, nnz):
        raise AssertionError(f"{path}: TextParser and TextShard disagree")
    out = {"bytes": size, "chunk_bytes": chunk_bytes, "rows": rows,
           "features_per_row": nnz / rows}
    for name, run in (("read", lambda: read(path, chunk_bytes)),
                      ("kernel", lambda: kernel(path, text, chunk_bytes)),
                      ("pass", lambda: whole_pass(path))):
        seconds = best(run, repeats)
        out[name] = {"seconds": seconds, "mb_per_s": size / seconds / 1e6,
                     "rows_per_s": rows / seconds}
    for name in ("kernel", "pass"):
        out[name]["of_read"] = out[name]["mb_per_s"] / out["read"]["mb_per_s"]
    return out


def inputs_of(tsv: str) -> dict:
    """The Criteo TSV, its conversion and its Parquet file (made once beside it)."""
    stem = tsv[:-len(".train.tsv")]
    shards, table = f"{stem}.train.bin", f"{stem}.train.parquet"
    if not os.path.exists(shards):
        subprocess.run([sys.executable, "-m", "mpips", "convert", tsv, shards], check=True,
                       capture_output=True, env={**os.environ, **MPI_ENV})
    if not os.path.exists(table):
        import pyarrow as pa
        import pyarrow.csv as csv
        import pyarrow.parquet as pq
        names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
        types = {"label": pa.int8(), **{f"I{i}": pa.int64() for i in range(1, 14)},
                 **{f"C{i}": pa.string() for i in range(1, 27)}}
        read = csv.read_csv(tsv, csv.ReadOptions(column_names=names),
                            csv.ParseOptions(delimiter="\t"),
                            csv.ConvertOptions(column_types=types, strings_can_be_null=True))
        pq.write_table(read, table + ".tmp", row_group_size=1 << 16)
        os.replace(table + ".tmp", table)
    return {"text": tsv, "shards": shards, "parquet": table}


def minibatch_pass(path: str) -> tuple[int, int]:
    """(rows, features) of a worker's pass over all of `path` in minibatches, each batch's
    keys read once (a memory-mapped batch is otherwise a view not yet read)."""
    rows = nnz = 0
    for batch in open_shard(path, 0, 1).minibatches(BATCH):
        np.bitwise_xor.reduce(batch.indices)
        rows += len(batch)
        nnz += batch.indices.shape[0]
    return rows, nnz


def parquet_decode(path: str) -> None:
    import pyarrow.parquet as pq
    schema = pq.read_schema(path)
    strings = [f.name for f in schema if str(f.type) == "string"]   # as ParquetShard reads
    f = pq.ParquetFile(path, read_dictionary=strings)
    for g in range(f.num_row_groups):
        f.read_row_group(g, use_threads=False)   # as ParquetShard reads: one core


def sources(tsv: str, repeats: int) -> dict:
    """rows/s of a minibatch pass over the Criteo rows as text, shards and Parquet."""
    paths = inputs_of(tsv)
    out: dict = {}
    for name, path in paths.items():
        rows, nnz = minibatch_pass(path)
        seconds = best(lambda path=path: minibatch_pass(path), repeats)
        out[name] = {"path": os.path.basename(path), "rows": rows, "nnz": nnz,
                     "seconds": seconds, "rows_per_s": rows / seconds}
    if len({(r["rows"], r["nnz"]) for r in out.values()}) != 1:
        raise AssertionError(f"the inputs disagree on rows and features: {out}")
    seconds = best(lambda: parquet_decode(paths["parquet"]), repeats)
    out["parquet_decode"] = {"seconds": seconds, "rows_per_s": out["parquet"]["rows"] / seconds}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "formats.json"))
    args = parser.parse_args()
    results = {fmt: rates(dataset(fmt, args.rows), args.repeats)
               for fmt in ("svmlight", "criteo")}
    for fmt, r in results.items():
        print(f"{fmt:9} {r['bytes'] / 1e6:6.1f} MB  {r['features_per_row']:4.1f} features/row  "
              f"read {r['read']['mb_per_s']:6.0f} MB/s", end="")
        for name in ("kernel", "pass"):
            print(f"  {name} {r[name]['mb_per_s']:5.0f} MB/s ({r[name]['of_read']:.2f} of read, "
                  f"{r[name]['rows_per_s'] / 1e3:4.0f}k rows/s)", end="")
        print()
    c, s = results["criteo"]["pass"], results["svmlight"]["pass"]
    print(f"criteo / svmlight, whole pass: {c['mb_per_s'] / s['mb_per_s']:.2f}x in MB/s, "
          f"{c['rows_per_s'] / s['rows_per_s']:.2f}x in rows/s (one core)")
    side = sources(dataset("criteo", args.rows), args.repeats)
    print("Criteo rows as each input, a pass of minibatches (one core):")
    for name, r in side.items():
        print(f"  {name:15} {r['rows_per_s'] / 1e3:7.0f}k rows/s")
    save(args.out, "formats", rows=args.rows, results=results, inputs=side)


if __name__ == "__main__":
    main()
