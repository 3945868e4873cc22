"""Run under torchrun by tests/unit/trainer/test_dataprep_ranks.py: every rank calls prepare_rows on
the same data and cache; writes what it saw to OUT/rank{RANK}.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dataformat.errors import InvalidJobError
from jobspec.job import JobSpec
from trainer.data.prep import prepare_rows
from trainer.distributed import init_distributed, shutdown
from trainer.events import NullReporter


def main(spec_path: str, cache: str, out: str) -> None:
    info = init_distributed("cpu")
    spec = JobSpec.load(spec_path)
    result: dict[str, object] = {"rank": info.rank}
    try:
        prepared = prepare_rows(
            spec, str(spec.data.uri), None, cache_dir=Path(cache), dist=info,
            reporter=NullReporter(),
        )  # fmt: skip
        result |= {"entry": str(prepared.directory), "rows": len(prepared.train)}
    except InvalidJobError as exc:
        result |= {"invalid": str(exc)}
    Path(out, f"rank{info.rank}.json").write_text(json.dumps(result))
    shutdown(info, clean=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
