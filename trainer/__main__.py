"""`python -m trainer` / `torchrun -m trainer`: see `trainer.train`."""

from trainer.train import main

# The guard matters: DCP's process-based async save spawns interpreters that import this.
if __name__ == "__main__":
    main()
