"""argparse value types shared by the command lines (moe-cpu, its demo)."""
from __future__ import annotations

import argparse
from typing import Callable


def at_least(lo: float, kind: type, what: str) -> Callable[[str], object]:
    """An argparse type: a `kind` number >= lo."""
    def parse(s: str):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
        if not v >= lo:   # (also refuses NaN)
            raise argparse.ArgumentTypeError(f"must be >= {lo:g}, got {s!r}")
        return v
    return parse
