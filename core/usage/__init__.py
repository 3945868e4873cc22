"""What jobs used (slot-seconds and CPU-seconds per node and attempt) and the reports over it."""
