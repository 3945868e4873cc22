"""The OpenAI-compatible view: a fine-tuning body as a JobSpec, and datasets and jobs projected into
OpenAI's shapes."""
