"""Example specs and the offline data they train on (`torchyard quickstart --example`)."""
