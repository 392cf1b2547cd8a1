"""Dense tables in HDF5 files, one per server: each file holds the blocks its server
answered for (`DenseTables.datasets`: dense/NAME/shape, blocks, values), and together the
files hold every block once. Read back into any number of servers, each taking the blocks
it holds from whichever file has them. Full-batch checkpoints and `DenseClient.save` and
`load` both write and read them."""
import json
import os
from dataclasses import dataclass

import numpy as np

from ..base.errors import ProtocolError
from ..base.files import open_hdf5
from ..wire.dense_layout import Layout

INDEX = "tables.json"   # written last by DenseClient.save: the files and the tables' shapes
INDEX_FORMAT = "mpips-dense-tables"


def read_blocks(paths: list, tables) -> int:
    """Create in `tables` (a server's DenseTables) every table of the files at `paths`, and
    fill the blocks the server holds from whichever file has them; returns the blocks
    filled. ValueError naming the file for a table whose shape differs from the one the
    servers hold or whose values do not match its blocks, or the table for a block held
    here that no file has."""
    filled: dict[str, set[int]] = {}
    seen: dict = {}   # table name -> the table in `tables`
    for path in paths:
        with open_hdf5(path) as f:
            for name in f.get("dense", []):
                n, width, block_rows = (int(x) for x in f[f"dense/{name}/shape"][()])
                try:
                    layout = Layout(n, width, block_rows)
                    table = tables.create(name, layout)
                except (ProtocolError, ValueError, ZeroDivisionError) as e:
                    raise ValueError(f"{path}: table {name!r}: {e}") from None
                numbers = f[f"dense/{name}/blocks"][()].tolist()
                if any(not 0 <= b < layout.n_blocks for b in numbers):
                    raise ValueError(f"{path}: table {name!r} names blocks outside its "
                                     f"{layout.n_blocks}")
                sizes = [layout.rows(b) * width for b in numbers]
                values = f[f"dense/{name}/values"]
                if values.shape != (sum(sizes),):
                    raise ValueError(f"{path}: dense/{name}/values holds {values.shape} "
                                     f"values; its {len(numbers)} blocks have {sum(sizes)}")
                at = 0
                for b, size in zip(numbers, sizes):
                    if b in table.blocks:
                        table.blocks[b][:] = values[at:at + size]
                        filled.setdefault(name, set()).add(b)
                    at += size
                seen[name] = table
    for name, table in seen.items():
        missing = sorted(set(table.blocks) - filled.get(name, set()))
        if missing:
            raise ValueError(f"no file of {os.path.dirname(paths[0])} holds block "
                             f"{missing[0]} of table {name!r}")
    return sum(len(b) for b in filled.values())


@dataclass
class _Whole:
    layout: Layout
    blocks: dict   # block number -> float64[rows * width]


class _OneTable:
    """Every block of table `name`, in one process (the `tables` read_blocks fills); of the
    other tables, none."""

    def __init__(self, name: str):
        self.name = name
        self.tables: dict[str, _Whole] = {}

    def create(self, name: str, layout: Layout) -> _Whole:
        if name != self.name:
            return _Whole(layout, {})
        table = self.tables.setdefault(name, _Whole(layout, {
            b: np.zeros(layout.rows(b) * layout.width) for b in range(layout.n_blocks)}))
        if table.layout != layout:
            raise ValueError(f"{layout.n} rows of width {layout.width} in blocks of "
                             f"{layout.block_rows}, where another file has {table.layout.n}, "
                             f"{table.layout.width}, {table.layout.block_rows}")
        return table


def read_table(paths: list, name: str) -> np.ndarray:
    """Table `name` whole, float64[rows, width], from the files at `paths` (read_blocks:
    ValueError if a block is in none of them)."""
    tables = _OneTable(name)
    read_blocks(paths, tables)
    if name not in tables.tables:
        raise ValueError(f"no file of {os.path.dirname(paths[0])} holds table {name!r}")
    table = tables.tables[name]
    values = [table.blocks[b] for b in range(table.layout.n_blocks)]
    return np.concatenate(values).reshape(table.layout.n, table.layout.width)


def index_of(directory: str) -> dict:
    """The index `DenseClient.save` wrote in `directory`; ValueError naming it if absent
    or not one."""
    path = os.path.join(directory, INDEX)
    try:
        with open(path) as f:
            index = json.load(f)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror} (is {directory} a directory of dense tables "
                         f"written by save?)") from None
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or not all(
            isinstance(index.get(k), t) for k, t in (("files", list), ("tables", dict))):
        raise ValueError(f"{path}: not an index of dense tables (format {INDEX_FORMAT})")
    return index
