"""Hyperparameter sweeps: many trials of one base spec, each an ordinary job, searched and
pruned by the server (Optuna).

    with Client() as client:
        sweep = client.sweeps.create({
            "name": "lr", "base": spec,
            "space": {"optim.lr": {"log_uniform": [1e-5, 1e-2]}},
            "pruner": {"kind": "asha", "min_resource": 100},
            "max_trials": 16, "max_concurrent_trials": 4,
        })
        sweep = client.sweeps.wait(sweep.id)
        print(sweep.best.params, sweep.best.value)

``torchyard sweep submit|show|trials|best|cancel`` are the same calls.
"""

from __future__ import annotations

import builtins
import time
from typing import Any

from pydantic import BaseModel

from torchyard.transport import Transport
from torchyard.types import Page, Sweep, Trial

ENDED = frozenset({"succeeded", "failed", "cancelled", "pruned"})


class Sweeps:
    """``client.sweeps``: start, list, inspect and cancel sweeps."""

    def __init__(self, client: Transport) -> None:
        self._client = client

    def create(self, spec: dict[str, Any] | BaseModel) -> Sweep:
        """Start a sweep (a `jobspec.sweep.SweepSpec` or its dict form). Raises
        `ValidationFailed` (422) naming every bad path at once (a search-space path that is no
        field, a distribution the field cannot take, a metric never reported, a grid larger
        than `max_trials`, the base spec's own problems under ``base``)."""
        body = spec.model_dump(mode="json") if isinstance(spec, BaseModel) else spec
        return Sweep.model_validate(self._client.request("POST", "/v1/sweeps", json=body))

    def list(self, *, after: int | None = None, limit: int | None = None) -> Page[Sweep]:
        """One page of the project's sweeps, newest first (`next_cursor`: pass as `after`)."""
        answer = self._client.request("GET", "/v1/sweeps", params={"after": after, "limit": limit})
        return Page[Sweep].model_validate(
            {"items": answer["items"], "next_cursor": answer.get("next_after")}
        )

    def get(self, sweep_id: int) -> Sweep:
        """One sweep. Raises `NotFound`."""
        return Sweep.model_validate(self._client.request("GET", f"/v1/sweeps/{sweep_id}"))

    def trials(self, sweep_id: int) -> builtins.list[Trial]:
        """Every trial of the sweep, by number."""
        answer = self._client.request("GET", f"/v1/sweeps/{sweep_id}/trials")
        return [Trial.model_validate(item) for item in answer["items"]]

    def cancel(self, sweep_id: int) -> Sweep:
        """Cancel the sweep and its queued and running trials. Raises `Conflict` when it
        already ended."""
        return Sweep.model_validate(self._client.request("POST", f"/v1/sweeps/{sweep_id}/cancel"))

    def wait(self, sweep_id: int, *, poll_s: float = 5.0, timeout_s: float | None = None) -> Sweep:
        """Poll until the sweep ended and return it. Raises `TimeoutError` after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            sweep = self.get(sweep_id)
            if sweep.state in ENDED:
                return sweep
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {sweep_id} still {sweep.state} after {timeout_s} s")
            time.sleep(poll_s)
