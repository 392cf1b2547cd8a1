"""Closed choices of a configuration (a solver, a consistency model, a format ...): enum
members that are their strings, so that they compare equal to, print as and serialise as
the text a user gives (Python 3.10 has no enum.StrEnum)."""
from enum import Enum


class Choice(str, Enum):
    """A closed choice whose value is its text."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)
