"""Builders of what the examples and the quickstart's fine-tuning examples need and no hub may
provide here: a small Llama and its tokenizer made offline (`offline_llama`), and the examples'
data (`docstrings`: stdlib functions and their docstrings; `sums`: sums of two small numbers).
Not part of any running service: `torchyard quickstart --example` runs `offline_llama` as a
process (it needs torch and `transformers`, which the client must not import) and imports the
data builders (standard library only); tests and benches import them all."""
