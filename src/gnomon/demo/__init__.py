"""The demo that `make run` shows."""
