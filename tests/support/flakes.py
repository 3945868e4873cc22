"""The flake ledger (issue 44): `bash scripts/test.sh --repeat N MODULE...` runs each module N
times, each run in another random order (a fresh pytest-randomly seed), one module at a time in
one pytest process (no xdist: the module's fixtures and order are what is exercised), and prints
a line per module with its pass rate and the seeds of the failed runs, to rerun one
(`-p randomly -p "randomly_seed=SEED"` is `--randomly-seed=SEED`). Exits non-zero unless every
run passed. A skip counts as a failure (TORCHYARD_TEST_NO_SKIPS=1, as in the suite)."""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/test.sh --repeat")
    parser.add_argument("--repeat", type=int, required=True, help="runs per module")
    parser.add_argument("modules", nargs="+", help="test modules (paths)")
    args = parser.parse_args(argv)
    env = {**os.environ, "TORCHYARD_TEST_NO_SKIPS": "1"}
    ok = True
    for module in args.modules:
        failed: list[int] = []
        started = time.monotonic()
        for _ in range(args.repeat):
            seed = random.randrange(1, 2**31)
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "randomly",
                 f"--randomly-seed={seed}", "-n", "0", module],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                failed.append(seed)
        passed = args.repeat - len(failed)
        minutes = (time.monotonic() - started) / 60
        seeds = f"; failed with seeds {failed}" if failed else ""
        print(f"{module}: {passed}/{args.repeat} passed ({minutes:.1f} min){seeds}", flush=True)
        ok = ok and not failed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
