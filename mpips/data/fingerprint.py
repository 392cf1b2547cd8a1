"""What an input looked like when a checkpoint was written, so that a resume notices a change.

A checkpoint records where each worker stands in its data (a byte or a row). If the file was
edited since, that place means nothing, so a resume compares the file's size, modification
time and a SHA-256 of its first and last MiB (cheap for any size; 64 KiB of each file of a converted
dataset) with what was recorded.
"""
import hashlib
import os
import time

from .inputs import SUFFIX

SAMPLE_BYTES = 1 << 20        # of a text file, from each end
PART_SAMPLE_BYTES = 64 << 10  # of each file of a converted dataset, which may have hundreds


def of_file(path: str, sample: int = SAMPLE_BYTES) -> dict:
    st = os.stat(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(sample))
        if st.st_size > sample:
            f.seek(max(sample, st.st_size - sample))
            digest.update(f.read(sample))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_tail_sha256": digest.hexdigest()}


def of_input(path: str) -> dict:
    """A file's fingerprint (text or Parquet), or for a folder (a converted dataset, Parquet
    files) each of its data files'."""
    if os.path.isdir(path):
        return {"files": {name: of_file(os.path.join(path, name), PART_SAMPLE_BYTES)
                          for name in sorted(os.listdir(path))
                          if name == "meta.json" or name.endswith((".npy", SUFFIX))}}
    return of_file(path)


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def _file_changes(name: str, then: dict, now: dict) -> list:
    found = []
    if then["size"] != now["size"]:
        found.append(f"{name}: size {then['size']:,} -> {now['size']:,} bytes")
    if then["mtime_ns"] != now["mtime_ns"]:
        found.append(f"{name}: modified {_when(then['mtime_ns'])} -> {_when(now['mtime_ns'])}")
    if then["head_tail_sha256"] != now["head_tail_sha256"]:
        found.append(f"{name}: its first or last MiB differ")
    return found


def changes(path: str, then: dict, now: dict) -> list:
    """How input `path` differs between two fingerprints (empty if it does not)."""
    if "files" not in then and "files" not in now:
        return _file_changes(path, then, now)
    before, after = then.get("files", {}), now.get("files", {})
    found = [f"{path}/{n}: missing now" for n in sorted(set(before) - set(after))]
    found += [f"{path}/{n}: new" for n in sorted(set(after) - set(before))]
    for name in sorted(set(before) & set(after)):
        found += _file_changes(f"{path}/{name}", before[name], after[name])
    return found
