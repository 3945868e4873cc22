"""`--smoke` for every bench: tiny sizes that run the bench's whole path in seconds.

The test suite runs each bench this way (tests/integration/test_benches.py) so that none of
them rots unseen; a smoke run's figures mean nothing and nothing asserts them. Standard
library only: the CUDA scripts run where the server's dependencies may be absent.
"""

from __future__ import annotations

import argparse
from typing import Any


def parse(parser: argparse.ArgumentParser, **tiny: Any) -> argparse.Namespace:
    """`parser`'s arguments, with a `--smoke` flag that sets each of `tiny` (argument dest ->
    value) over what was given."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes: the whole path in seconds, figures meaningless (the test suite "
        "runs every bench so)",
    )
    args = parser.parse_args()
    if args.smoke:
        for dest, value in tiny.items():
            if not hasattr(args, dest):
                raise AttributeError(f"--smoke sets {dest!r}, which is not an argument")
            setattr(args, dest, value)
    return args
