"""Small compacted topics read whole by every instance that needs them: tenant limits and
usage (``tenants``), alert configs (``gnomon.alerts.feed``), all on one reader
(``compacted.CompactedFeed``) over the event-log port. The processor and the API both
read tenant limits; neither imports the other for it."""
