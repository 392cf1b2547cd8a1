"""The parts of an option of `train`: how its value is read from text (and checked), and
`Option`, its group, flag and argparse keywords, with what `mpips.train` takes for it."""
import argparse
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base.errors import ConfigError


def values(kind) -> tuple:
    """The strings of an enum's members: a closed choice's."""
    return tuple(member.value for member in kind)


def widths(text: str) -> tuple:
    """'64,32' -> (64, 32)."""
    try:
        return tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not layer widths such as 64,32") from None


def finite_float(text: str) -> float:
    """A number option: inf and nan are refused here, before any rank starts work."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number")
    return value


def epochs_or_off(text: str) -> float:
    """--average-after: a number of epochs >= 0, or "off" (-1)."""
    if text.strip().lower() == "off":
        return -1.0
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give epochs >= 0, or off")
    return value


def checkpoint_interval(text: str) -> tuple[int, float]:
    """--checkpoint-every: "500" is (500 clocks, 0 s); "30s", "10m", "2h" are (0, seconds)."""
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:].lower())
    try:
        value = float(text[:-1]) if scale else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of clocks (500) or of seconds, minutes or hours "
            f"(30s, 10m, 2h)") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number, not negative")
    return (0, value * scale) if scale else (int(value), 0.0)


def byte_size(text: str) -> int:
    from ..base.budget import parse_bytes
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def straggler(text: str):
    worker, _sep, rest = text.partition(":")
    factor, _sep, clocks = rest.partition(":")
    try:
        if clocks:
            return int(worker), finite_float(factor), int(clocks)
        return int(worker), finite_float(factor)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected W:FACTOR such as 0:3, or W:FACTOR:CLOCKS "
                                         f"such as 0:3:50, got {text!r}") from None


@dataclass(frozen=True)
class Option:
    """One `train` option: its group (a key of GROUPS), its flag, and argparse's keywords for
    it (type, default, choices, action, dest, metavar, help)."""
    group: str
    flag: str
    spec: dict

    @property
    def name(self) -> str:
        """Its name among `mpips.train`'s keyword options, and in parsed arguments."""
        return self.spec.get("dest") or self.flag[2:].replace("-", "_")

    @property
    def default(self):
        action = self.spec.get("action")
        return self.spec.get("default", {"store_true": False, "store_false": True,
                                         "append": []}.get(action or ""))

    def value(self, given):
        """The option's value for `given`, a keyword option's: a flag's bool, or a value of
        the option's type, or the command line's text for it (parsed as there), or for a
        repeatable option a list of those. ConfigError naming the option if it is none."""
        action = self.spec.get("action")
        if action in ("store_true", "store_false"):
            if not isinstance(given, bool):
                raise ConfigError(f"{self.name}={given!r}: give True or False")
            return given
        if action == "append":
            if not isinstance(given, (list, tuple)):
                raise ConfigError(f"{self.name}={given!r}: give a list of {self._kind().what}")
            return [self._one(item) for item in given]
        return self._one(given)

    def _kind(self) -> "_Kind":
        return KINDS.get(self.spec.get("type"), TEXT)

    def _one(self, given):
        kind = self._kind()
        if isinstance(given, str):
            text = given
        elif isinstance(given, kind.accepts) and not isinstance(given, bool):
            text = kind.text(given)
        else:
            raise ConfigError(f"{self.name}={given!r}: give {kind.what}")
        parse = self.spec.get("type", str)
        try:
            value = parse(text)
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"argument {self.flag}: {e}") from None
        except ValueError:
            raise ConfigError(f"argument {self.flag}: invalid {parse.__name__} value: "
                              f"{text!r}") from None
        choices = self.spec.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"argument {self.flag}: invalid choice: {value!r} (choose from "
                              f"{', '.join(map(repr, choices))})")
        return value


def train_option(group: str, flag: str, **spec) -> Option:
    return Option(group, flag, spec)


@dataclass(frozen=True)
class _Kind:
    """The Python values a keyword option of one type takes besides its text, and that text."""
    accepts: tuple
    text: Callable[[Any], str]   # value -> the command line's text for it
    what: str


def _number_text(value) -> str:
    return str(int(value)) if isinstance(value, numbers.Integral) else repr(float(value))


TEXT = _Kind((os.PathLike,), os.fspath, "text")
KINDS = {
    int: _Kind((numbers.Integral,), _number_text, "an integer"),
    finite_float: _Kind((numbers.Real,), _number_text, "a number"),
    epochs_or_off: _Kind((numbers.Real,), _number_text, "a number of epochs, or 'off'"),
    checkpoint_interval: _Kind((numbers.Integral,), _number_text,
                               "a number of clocks, or of seconds such as '30s'"),
    byte_size: _Kind((numbers.Integral,), _number_text,
                     "a number of bytes, or a size such as '4G'"),
    widths: _Kind((tuple, list), lambda v: ",".join(map(str, v)), "layer widths such as (64, 32)"),
    straggler: _Kind((tuple, list), lambda v: ":".join(map(str, v)),
                      "(worker, factor) pairs such as (0, 3)"),
}
