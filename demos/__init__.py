"""Builders of what the examples and the quickstart's fine-tuning examples need and no hub may
provide here: a small Llama and its tokenizer made offline (`offline_llama`). Not part of any
running service: `torchyard quickstart --example` runs them as a process (they need torch and
`transformers`, which the client must not import), tests and benches import them."""
