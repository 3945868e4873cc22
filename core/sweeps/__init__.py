"""Hyperparameter sweeps: a resource whose trials are ordinary jobs, searched and pruned by
Optuna on Torchyard's own database (`study`: the Optuna glue; `service`: create, read,
cancel; `drive`: the controller's round that starts and ends trials; `prune`: the report and
pruning decision a worker makes as a trial's metric is ingested)."""
