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


def token_counts(s: str) -> list[int]:
    """An argparse type: comma-separated token counts, each >= 1 ("1,128,1024")."""
    try:
        ms = [int(v) for v in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts, got {s!r}") from None
    if any(m < 1 for m in ms):
        raise argparse.ArgumentTypeError(f"token counts must be >= 1, got {s!r}")
    return ms
