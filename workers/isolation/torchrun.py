"""`python -m workers.isolation.torchrun ARGS`: torchrun (`torch.distributed.run ARGS`) for a node
that runs in a sandbox of its own (`workers.isolation.sandbox`).

torch's c10d rendezvous tells its participants apart by (address, pid, local id) (`_NodeDesc`
in `torch.distributed.elastic.rendezvous.dynamic_rendezvous`). In a PID namespace of its own
every node's torchrun is pid 2, so two nodes of one gang on one host (one address) are one
participant to the rendezvous, which then never completes (measured: `RendezvousTimeoutError`
on every same-host gang). This runs torchrun's own `main` with that pid replaced by a random
31-bit id drawn once per process (an agent restarted in place keeps it). Nothing else changes;
this module runs only as a process of its own, never inside the worker.
"""

from __future__ import annotations

import secrets

from torch.distributed import run
from torch.distributed.elastic.rendezvous import dynamic_rendezvous

NODE_ID = secrets.randbits(31)
_generate = dynamic_rendezvous._NodeDescGenerator.generate


def _generate_unique(
    self: dynamic_rendezvous._NodeDescGenerator, local_addr: str | None = None
) -> dynamic_rendezvous._NodeDesc:
    desc = _generate(self, local_addr)
    return dynamic_rendezvous._NodeDesc(desc.addr, NODE_ID, desc.local_id)


dynamic_rendezvous._NodeDescGenerator.generate = _generate_unique  # type: ignore[method-assign]

if __name__ == "__main__":
    run.main()
