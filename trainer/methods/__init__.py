"""Training methods: what a step's micro-batches compute, behind the loop's `Method` protocol
(`base`): next-token prediction (`sft`), DPO's loss (`dpo`) and its step over preference pairs
(`dpo_train`); and quantization-aware training (`qat`, torchao), which fake-quantizes the model
whichever method trains it."""
