from harness import callback_server, stack  # noqa: F401  (fixtures)
