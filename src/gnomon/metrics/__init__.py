"""Prometheus metrics of gnomon's processes (docs/operations.md, "Monitoring").

One module per process kind (``processor``, ``worker``, ``projector``, ``api``), each
with a class that owns its own ``CollectorRegistry``: the in-memory harness runs many
processors and workers in one process, and each keeps its own counts. ``serve`` exposes
a registry on a port; the API serves its registry on its own HTTP port at ``/metrics``.
Counting happens at the edges (runtime loops, attempt start and end, API middleware),
never in ``gnomon.core``. No label carries a job, run or tenant id: label values come
from bounded sets (pools, priorities, outcomes, reasons, topics, partitions, routes).
"""

from __future__ import annotations

import prometheus_client as _prometheus_client

# start lag: from 5 ms (idle) to 5 min (a backlog after an outage)
START_LAG_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WINDOW_S = 60  # the "last minute" of gnomon status

# No *_created series: they double the series count and nothing here reads them.
_prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
