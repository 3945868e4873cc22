"""Jobs: the state machine and services, listing, what a run reports (keyed upserts, reads,
downsampling, rollups), progress, alerts, `init_from`, exports, code archives, the YAML spec
reader."""
