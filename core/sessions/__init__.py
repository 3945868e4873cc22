"""Training sessions of the Tinker-compatible API (`/tinker`): `service.py`."""
