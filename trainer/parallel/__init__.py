"""Parallelism: mesh layout (`dims`), strategies (`parallelize`), pipeline stages."""

from trainer.parallel.dims import ParallelDims, reporting_rank
from trainer.parallel.parallelize import (
    Parallelized,
    clip_grad_norm,
    parallelize,
    set_gradient_sync,
)
from trainer.parallel.pipeline import PipelineRunner

__all__ = [
    "ParallelDims",
    "Parallelized",
    "PipelineRunner",
    "clip_grad_norm",
    "parallelize",
    "reporting_rank",
    "set_gradient_sync",
]
