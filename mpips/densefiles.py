"""Dense tables in HDF5 files, one per server: each file holds the blocks its server
answered for (`DenseTables.datasets`: dense/NAME/shape, blocks, values), and together the
files hold every block once. Read back into any number of servers, each taking the blocks
it holds from whichever file has them. Full-batch checkpoints and `DenseClient.save` and
`load` both write and read them."""
import json
import os

from .blocks import Layout
from .errors import ProtocolError
from .files import open_hdf5

INDEX = "tables.json"   # written last by DenseClient.save: the files and the tables' shapes
INDEX_FORMAT = "mpips-dense-tables"


def read_blocks(paths: list, tables) -> int:
    """Create in `tables` (a server's DenseTables) every table of the files at `paths`, and
    fill the blocks the server holds from whichever file has them; returns the blocks
    filled. ValueError naming the file for a table whose shape differs from the one the
    servers hold or whose values do not match its blocks, or the table for a block held
    here that no file has."""
    filled, seen = {}, {}
    for path in paths:
        with open_hdf5(path) as f:
            for name in (f["dense"] if "dense" in f else []):
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
