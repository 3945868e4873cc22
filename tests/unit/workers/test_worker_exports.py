"""The worker's exporter command line and environment, exactly (workers/exports.py)."""

from __future__ import annotations

from workers.exports import export_argv, export_env


def test_the_exporter_is_the_trainers_export_module_with_the_checkpoint_and_output() -> None:
    argv = export_argv("s3://b/jobs/7/checkpoints/step_00000040", "s3://b/jobs/7/exports/x", "py")
    assert argv == [
        "py", "-m", "trainer.exports.safetensors",
        "--checkpoint", "s3://b/jobs/7/checkpoints/step_00000040",
        "--out", "s3://b/jobs/7/exports/x",
    ]  # fmt: skip


def test_the_exporter_gets_no_worker_settings_but_keeps_the_rest_of_the_environment() -> None:
    base = {
        "TORCHYARD_DATABASE_URL": "postgresql://secret@db/ty",
        "TORCHYARD_BROKER_URL": "redis://r",
        "AWS_ACCESS_KEY_ID": "for-fsspec",
        "OMP_NUM_THREADS": "2",
        "PATH": "/usr/bin",
    }
    assert export_env(base) == {
        "AWS_ACCESS_KEY_ID": "for-fsspec",
        "OMP_NUM_THREADS": "2",
        "PATH": "/usr/bin",
    }
