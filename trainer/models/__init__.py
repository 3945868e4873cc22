"""The networks a job trains: the built-in GPT (`gpt`), Hugging Face causal LMs (`hf`, with
the offline stand-ins of `offline`), and `network.build_network`, which builds either with
its starting weights (`model.init_from`), 4-bit quantization (QLoRA) and LoRA adapters."""
