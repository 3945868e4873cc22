"""Training methods beyond next-token prediction: DPO's loss (`dpo`) and its step over
preference pairs (`dpo_train`), and quantization-aware training (`qat`, torchao)."""
