"""How every benchmark ends: its figures as JSON, named and dated, in bench/results/."""
import json
import os
import time


def save(path: str, bench: str, **fields) -> None:
    """Write {"bench", "date", **fields} to `path` and say so."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"bench": bench, "date": time.strftime("%Y-%m-%d %H:%M"), **fields}, f,
                  indent=2)
        f.write("\n")
    print(f"wrote {path}")
