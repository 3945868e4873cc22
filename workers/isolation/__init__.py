"""How a job's processes are contained on a worker's host: the bubblewrap sandbox
(`sandbox`) and its keeper process (`keeper`), the torchrun that runs inside it (`torchrun`),
the node's cgroup (`cgroups`) and the network fence (`netfence`)."""
