"""Workers: ``Worker(pool).handler(name)`` registers Python handlers (plain or
``async def``); ``Worker.run()`` serves. A handler takes one ``Context`` and may return
a JSON value, recorded as the run's output."""

from gnomon.worker.attempt import AttemptContext
from gnomon.worker.attempt import AttemptContext as Context
from gnomon.worker.worker import Worker

__all__ = ["AttemptContext", "Context", "Worker"]
