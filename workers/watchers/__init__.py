"""What the supervisor (`workers.supervisor`) runs beside a node's torchrun while it trains:
the pace of its steps and stragglers (`pace`), hang detection (`watchdog`), system metrics
(`sysmetrics`), CPU-seconds and the cost limit (`usage_watch`), a sweep trial's pruner
(`trials`)."""
