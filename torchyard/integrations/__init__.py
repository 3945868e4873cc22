"""Adapters between training libraries and `torchyard.train` (each imports its library)."""
