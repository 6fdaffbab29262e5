"""The alerter: reads the run ledger and calls each tenant's alert webhook
(``gnomon alerter``). The rules are in ``gnomon.core.alerts``; this package is the I/O:
``feed`` (the tenants' configs), ``sender`` (one signed, guarded call), ``service``
(the ledger consumer, delivery with retries, offset commits)."""
