"""What a run's checkpoints become outside the trainer: consolidated safetensors of the built-in
GPT (`safetensors`, also `python -m trainer.exports.safetensors` for the export workers) and a
LoRA run's PEFT adapter and merged weights (`lora`), written at the end of a run."""
