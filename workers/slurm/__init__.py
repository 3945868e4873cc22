"""The Slurm executor: a pool whose jobs Slurm places (issue 27; `TORCHYARD_SLURM_POOLS`).

Three parts, each as small as the part of the Celery path it replaces:

- `workers.slurm.batch` (pure): the `sbatch` script of a job, Slurm's `squeue --json` records
  read into `SlurmState`, and what a Slurm end means for the attempt (`OUT_OF_MEMORY` -> `oom`,
  `NODE_FAIL` -> `node_lost`, `PREEMPTED` -> `preempted`, ...).
- `workers.slurm.submitter`: on a login node, `python -m workers slurm --pool NAME` consumes
  the pool's queue like a worker; a `workers.run_job` delivery places the job (a `slurm_jobs`
  row, then `sbatch`), and a watcher thread follows its Slurm jobs (`squeue --json`): the
  pending reason and start estimate become the job's queue reason and ETA, a job cancelled in
  Torchyard is `scancel`led, an allocation that ended without its node agents recording the
  attempt's end fails the attempt with the class Slurm's state gives.
- `workers.slurm.agent`: what `srun` starts on every node of the allocation, once per node:
  node 0 claims the job and the others join its gang, then each runs the same node path as a
  Celery worker (`workers.node`: launcher, sandbox, cgroup, supervisor, ingest, usage, exits),
  so events, metrics, logs and checkpoints reach Torchyard as from any worker.
"""
