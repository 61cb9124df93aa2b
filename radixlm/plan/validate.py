"""Input validation for the planner: one set of allowed ranges, used two ways.

* As argparse ``type=`` converters (`positive_int`, `non_negative_int`, `positive_float`,
  `non_negative_float`, `fraction`, `probability`, `int_list`, `length_dist`): a bad
  value makes argparse print one line naming the flag and the allowed range, e.g.
  ``argument --page-size: must be an integer >= 1, got '0'``, and exit 2.
  `OneLineParser` makes every argparse error a single line, and `HelpFormatter` shows
  each flag's default in ``--help``.
* In the pure functions, through `Range.check`: a value outside the range raises
  ValueError with the parameter's name and the range, before it can divide by zero or
  give a silently wrong answer. The CLI turns that ValueError into one line and exit 2.

Every float range also rejects NaN and infinities.
"""

from __future__ import annotations

import argparse
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass

from radixlm.plan.lengths import LengthDist


@dataclass(frozen=True)
class Range:
    """A closed or half-open interval of finite numbers, optionally integers only."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False

    def describe(self) -> str:
        """'an integer >= 1', 'a number in (0, 1]', 'a number > 0', ..."""
        what = "an integer" if self.integer else "a number"
        if self.lo is not None and self.hi is not None:
            left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"{what} in {left}{self.lo:g}, {self.hi:g}{right}"
        if self.lo is not None:
            return f"{what} {'>' if self.lo_open else '>='} {self.lo:g}"
        if self.hi is not None:
            return f"{what} {'<' if self.hi_open else '<='} {self.hi:g}"
        return what if self.integer else "a finite number"

    def contains(self, value: float) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.integer and not isinstance(value, numbers.Integral):
            return False
        if not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        return self.hi is None or (value < self.hi if self.hi_open else value <= self.hi)

    def check(self, name: str, value):
        """Return `value` if it lies in the range, else raise ValueError naming `name`."""
        if not self.contains(value):
            raise ValueError(f"{name} must be {self.describe()}, got {value!r}")
        return value


POSITIVE_INT = Range(1, integer=True)
NON_NEGATIVE_INT = Range(0, integer=True)
POSITIVE = Range(0, lo_open=True)
NON_NEGATIVE = Range(0)
FRACTION = Range(0, 1, lo_open=True)  # a share of something: (0, 1]
PROBABILITY = Range(0, 1)  # [0, 1]
FINITE = Range()


def _converter(rng: Range, name: str) -> Callable[[str], float]:
    """An argparse ``type=`` function parsing a string into a number within `rng`."""

    def convert(text: str):
        try:
            value = int(text) if rng.integer else float(text)
        except ValueError:
            value = None
        if value is None or not rng.contains(value):
            raise argparse.ArgumentTypeError(f"must be {rng.describe()}, got {text!r}")
        return value

    convert.__name__ = name
    return convert


positive_int = _converter(POSITIVE_INT, "positive_int")
non_negative_int = _converter(NON_NEGATIVE_INT, "non_negative_int")
positive_float = _converter(POSITIVE, "positive_float")
non_negative_float = _converter(NON_NEGATIVE, "non_negative_float")
fraction = _converter(FRACTION, "fraction")
probability = _converter(PROBABILITY, "probability")
finite = _converter(FINITE, "finite")


def int_list(text: str) -> list[int]:
    """Comma-separated positive integers ("1,2,4,8")."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated integers >= 1 (e.g. 1,2,4,8), got {text!r}"
        )
    return values


def length_dist(text: str) -> str:
    """Check a length distribution ("512" or "128:0.5,2048:0.5"); returns the text."""
    try:
        LengthDist.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def one_line(text: object) -> str:
    """`text` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" to each flag's help; "(default: none)" for optional flags
    without one; nothing for switches, required flags, or helps that state a default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is False or action.required or "default" in text:
            return text
        if action.default is None:
            return f"{text} (default: none)"
        return super()._get_help_string(action)
