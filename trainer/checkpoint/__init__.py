"""Weights in and out of a run: sharded DCP checkpoints (`checkpointer`, `state`), starting
from another run's checkpoint (`init_from`), consolidated safetensors (`export`, also
`python -m trainer.checkpoint.export`) and LoRA adapter exports (`lora_export`)."""
