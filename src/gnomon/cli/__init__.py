"""The ``gnomon`` command line (typer + rich)."""
