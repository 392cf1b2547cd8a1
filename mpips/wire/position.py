"""Where a worker stands in its data after a number of clocks, as the servers keep it from
the worker's reports and as a checkpoint's manifest records it (JSON)."""
from typing import NamedTuple


class Position(NamedTuple):
    """A worker after `clock` clocks: its next minibatch starts at `offset` (a byte offset in
    text, a row in binary shards; -1: the start) of range `segment` of epoch `epoch`'s work
    plan; `examples` trained so far, with `loss` their summed logloss. `taken`: the epoch at
    which it took each of its shares of dead workers' rows, in order. `finished`: it said
    FINISH there; `lost`: it died there (its clocks after it were dropped). (A NamedTuple:
    one is made for every clock a worker completes, and a frozen dataclass takes 2.4x as long
    to make.)"""
    clock: int
    epoch: int = 0
    segment: int = 0
    offset: int = -1
    examples: int = 0
    loss: float = 0.0
    finished: bool = False
    taken: tuple = ()
    lost: bool = False

    def but(self, **fields) -> "Position":
        """This position with `fields` changed."""
        return self._replace(**fields)

    def as_dict(self) -> dict:
        """As a manifest keeps it (JSON)."""
        return {**self._asdict(), "taken": list(self.taken)}

    @classmethod
    def from_dict(cls, d) -> "Position":
        """The position a manifest keeps as `d`; ValueError naming the field if it holds none
        (a field missing, of the wrong type, or out of range)."""
        if not isinstance(d, dict):
            raise ValueError(f"a position is a JSON object, not {type(d).__name__}")
        if "clock" not in d:
            raise ValueError("a position lacks its clock")
        ints = {}
        for name, least in (("clock", 0), ("epoch", 0), ("segment", 0), ("offset", -1),
                            ("examples", 0)):
            value = d.get(name, cls._field_defaults.get(name))
            if type(value) is not int or value < least:
                raise ValueError(f"a position's {name} is {value!r}, not an integer >= {least}")
            ints[name] = value
        loss = d.get("loss", 0.0)
        if type(loss) not in (int, float) or not 0.0 <= loss < float("inf"):
            raise ValueError(f"a position's loss is {loss!r}, not a number >= 0")
        taken = d.get("taken", [])
        if not isinstance(taken, list) or any(type(e) is not int or e < 0 for e in taken):
            raise ValueError(f"a position's taken is {taken!r}, not a list of epochs")
        flags = {}
        for name in ("finished", "lost"):
            flags[name] = d.get(name, False)
            if type(flags[name]) is not bool:
                raise ValueError(f"a position's {name} is {flags[name]!r}, not true or false")
        return cls(ints["clock"], ints["epoch"], ints["segment"], ints["offset"],
                   ints["examples"], float(loss), flags["finished"], tuple(taken), flags["lost"])
