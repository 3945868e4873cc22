"""From a dataset to the batches of a step: the byte tokenizer (`byte_tokenizer`), reading and
tokenizing with masks, chat templates and packing (`prep`, `textrows`, `packing`), the row
recipe and held-out split (`selection`), the rows contract (`rows`, docs/ARCHITECTURE.md),
preference pairs (`pairs`), the global batch sampler (`sampler`) and the loss over a batch
(`batches`)."""
