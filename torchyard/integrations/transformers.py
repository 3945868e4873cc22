"""`transformers.Trainer` on Torchyard: reports, checkpoints and stops through `torchyard.train`.

    from transformers import Trainer, TrainingArguments
    import torchyard.train as ty
    from torchyard.integrations.transformers import TorchyardCallback

    args = TrainingArguments(output_dir=str(ty.checkpoint_root()), save_steps=50, ...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[TorchyardCallback()])
    latest = ty.latest_checkpoint()          # the newest *complete* `checkpoint-N`
    trainer.train(resume_from_checkpoint=str(latest) if latest else None)

Let Torchyard keep checkpoints (`entrypoint.keep_last_checkpoints`) rather than
`save_total_limit`, whose deletions the platform would not hear of.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

import torchyard.train as ty

__all__ = ["TorchyardCallback"]


class TorchyardCallback(TrainerCallback):
    """Declares the Trainer's `state.max_steps` (`on_train_begin`: the job's progress and
    ETA), reports the Trainer's logs (`on_log`: a `metric` event at `state.global_step` with its
    numeric values: `loss`, `grad_norm`, `learning_rate`, `epoch`, ...), declares each saved
    `output_dir/checkpoint-N` complete (`on_save`; `output_dir` should be
    `torchyard.train.checkpoint_root()`), and on a stop (`should_stop()`, checked at every
    step's end on every rank) has the Trainer save and end training."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if state.max_steps and state.max_steps > 0:
            ty.set_max_steps(int(state.max_steps))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        values = {
            name: float(value)
            for name, value in (logs or {}).items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)
        }
        if values:
            ty.report(state.global_step, **values)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # the directory `Trainer._save_checkpoint` just wrote (every rank reaches this)
        output_dir = Path(str(args.output_dir))
        ty.completed_checkpoint(output_dir / f"checkpoint-{state.global_step}")

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if ty.should_stop():
            control.should_save = True
            control.should_training_stop = True
