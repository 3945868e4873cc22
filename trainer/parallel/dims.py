"""`ParallelDims`: how a job's ranks are laid out, and the `DeviceMesh` over them.

Row-major meshes from `init_device_mesh` (as torchtitan's `ParallelDims`):

| strategy | mesh dims | shape |
|---|---|---|
| `single`, `ddp` | none (DDP uses the default group) | |
| `fsdp` | `dp_shard` | (world,) |
| `fsdp`, nodes > 1 (HSDP) | `dp_replicate`, `dp_shard` | (nodes, procs_per_node) |
| `fsdp` x TP (2-D) | `dp`, `tp` | (world / tp, tp) |
| `tensor` | `tp` | (world,) |
| `pipeline` | `pp` | (world,) |

Rank r's data-parallel coordinate is r // tp (every rank of a tp group takes the same batch);
a pipeline is one data-parallel replica. Events come from the reporting rank: rank 0, or for
a pipeline the rank of the last stage (world - 1), where the loss is computed.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from dataformat.errors import InvalidJobError
from jobspec.job import JobSpec


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Sizes of the mesh axes; dp_replicate x dp_shard x tp x pp = `world_size`."""

    strategy: str  # parallelism.strategy
    world_size: int  # ranks launched
    dp_replicate: int  # HSDP replica groups (nodes), 1 otherwise
    dp_shard: int  # FSDP shard group size, or DDP ranks
    tp: int  # tensor-parallel group size
    pp: int  # pipeline ranks

    @classmethod
    def from_spec(cls, spec: JobSpec, world_size: int) -> ParallelDims:
        """The layout of `spec` on `world_size` launched ranks.

        Raises `InvalidJobError` when the launch does not fit the spec's tp or pipeline sizes
        (the API checks the spec's own world size; a launch may differ).
        """
        par = spec.parallelism
        tp = par.tp_size(world_size)
        if world_size % tp:
            raise InvalidJobError(f"tensor_parallel_size {tp} does not divide world {world_size}")
        if par.strategy in ("tensor", "pipeline") and world_size < 2:
            raise InvalidJobError(f"strategy {par.strategy!r} launched with one process")
        if par.strategy == "pipeline":
            stages = world_size * par.pipeline.stages_per_rank
            if stages > spec.model.n_layers or par.pipeline.num_microbatches < stages:
                raise InvalidJobError(f"{stages} pipeline stages do not fit this model/batch")
            return cls(
                strategy=par.strategy, world_size=world_size, dp_replicate=1, dp_shard=1,
                tp=1, pp=world_size,
            )  # fmt: skip
        nodes = spec.resources.nodes
        hsdp = par.strategy == "fsdp" and tp == 1 and nodes > 1 and world_size % nodes == 0
        replicate = nodes if hsdp else 1
        return cls(
            strategy=par.strategy,
            world_size=world_size,
            dp_replicate=replicate,
            dp_shard=world_size // tp // replicate,
            tp=tp,
            pp=1,
        )

    @property
    def dp_size(self) -> int:
        """Ranks that take distinct shares of each global batch."""
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        """The data-parallel coordinate of global `rank` (which share of the batch it takes)."""
        return 0 if self.pp > 1 else rank // self.tp

    @property
    def reporting_rank(self) -> int:
        """The rank that writes events: the last pipeline stage's, else rank 0."""
        return self.world_size - 1 if self.pp > 1 else 0

    @property
    def collective_forward(self) -> bool:
        """True when every rank must join each forward (sharded parameters)."""
        return self.strategy in ("fsdp", "tensor") and self.world_size > 1

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        """The job's `DeviceMesh` (see the module table); None for single, DDP and any
        stand-alone (world of one) run, which trains the plain model."""
        if self.strategy in ("single", "ddp") or self.world_size == 1:
            return None
        if self.strategy == "pipeline":
            return init_device_mesh(device_type, (self.pp,), mesh_dim_names=("pp",))
        if self.strategy == "tensor":
            return init_device_mesh(device_type, (self.tp,), mesh_dim_names=("tp",))
        shape: tuple[int, ...]
        names: tuple[str, ...]
        if self.tp > 1:
            shape, names = (self.dp_shard, self.tp), ("dp", "tp")
        elif self.dp_replicate > 1:
            shape, names = (self.dp_replicate, self.dp_shard), ("dp_replicate", "dp_shard")
        else:
            shape, names = (self.dp_shard,), ("dp_shard",)
        return init_device_mesh(device_type, shape, mesh_dim_names=names)


def reporting_rank(spec: JobSpec, world_size: int) -> int:
    """The rank that writes `events.jsonl` for `spec` launched on `world_size` ranks."""
    return world_size - 1 if spec.parallelism.strategy == "pipeline" and world_size > 1 else 0
