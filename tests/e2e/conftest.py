from harness import callback_server, no_jobs_left_behind, stack  # noqa: F401  (fixtures)
