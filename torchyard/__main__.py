"""``python -m torchyard``: the CLI, for when the console script is not on PATH."""

from torchyard.cli import main

main()
