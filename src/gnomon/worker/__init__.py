"""Workers: ``Worker(pool).handler(name)`` registers Python handlers; ``Worker.run()`` serves."""

from gnomon.worker.executors import AttemptContext
from gnomon.worker.worker import Worker

__all__ = ["AttemptContext", "Worker"]
