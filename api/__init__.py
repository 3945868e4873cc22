"""The HTTP control plane: FastAPI app factory (`api.main:create_app`), routes, auth, errors."""
