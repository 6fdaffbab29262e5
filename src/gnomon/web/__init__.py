"""The HTTP edge both the REST API (``gnomon.api``) and the web UI (``gnomon.ui``) stand
on: who is calling (``auth``), request bodies read within a bound (``body``) and
problem+json errors (``problems``). The API serves the UI; the UI does not import the API."""
