"""A team's own program (`entrypoint` jobs, docs/CONTRACTS.md section 5): its code archive
(`script`), its virtual environment (`venvs`), its checkpoints on remote storage (`staging`)."""
