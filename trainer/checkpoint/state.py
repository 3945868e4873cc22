"""The `Stateful` pieces of a run that checkpoints save besides the sampler and schedules.

Each has `state_dict()` / `load_state_dict()`, which `torch.distributed.checkpoint` calls on
save and load (`torch.distributed.checkpoint.stateful.Stateful`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

# Optimizer state flattened to one key per parameter and hyper-parameter
# (`optim.param_groups.<fqn>.lr`): pipeline ranks hold different parameters, and a
# per-group list of names saved by several ranks under one key would keep only one rank's.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class ModelOptimizerState:
    """Model and optimizer through DCP's `get_state_dict` / `set_state_dict`.

    Those handle wrappers (DDP's `module.` prefix, FSDP/TP DTensors, activation-checkpoint
    wrappers) and key the optimizer state by parameter name, so a checkpoint loads into any
    parallel layout (DCP reshards), also a pipeline rank's part of the model.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=_OPTIONS)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=_OPTIONS,
        )


@dataclass
class TrainState:
    """Progress of the run: optimizer steps done and the last global train loss."""

    step: int = 0
    last_loss: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "last_loss": self.last_loss}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.last_loss = state["last_loss"]


class RNGState:
    """This rank's torch RNG state (CPU, and the current CUDA device's when on CUDA).

    Per rank: the checkpointer stores it under a rank-specific key. Python's `random` and
    numpy's global generator are not used by the trainer (the sampler seeds its own).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        state = {"torch_cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["torch_cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch_cpu"])
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state["torch_cuda"], self.device)
