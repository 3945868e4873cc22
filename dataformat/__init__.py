"""Torch-free vocabularies that the control plane and the trainer share.

The API validates uploads and specs, core previews masks, the worker classifies exits and the
CLI reads spec files with the same code the trainer runs, so the two sides cannot drift:

- `records`: dataset record formats (pydantic models), the `loss_on` each format honours
- `jsonl`: JSON Lines reading (names, decompression, size-limited lines)
- `yaml12`: YAML 1.2 scalars for spec files
- `failures`: failure classes and the classification of exceptions and error files
- `errors`: the exceptions that decide how the trainer exits
- `chat`, `masks`, `readers`: chat templates, loss masks and their verifier, streaming readers
  (numpy, and `transformers`' tokenizers when given one; never torch)

Imports nothing of `trainer`, `api`, `core`, `workers` or `torchyard`, and never torch
(tests/unit/project/test_layers.py). Importing the package imports none of its modules.
"""
