"""The Tinker-compatible API (`/tinker/api/v1`, issue 47), as the official `tinker` client calls
it: `sessions` (connect, capabilities, sessions, training clients), `calls` (training and
sampling calls, futures) and `runs` (training runs and their checkpoints)."""
