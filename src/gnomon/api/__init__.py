"""The REST API (FastAPI): validates, authorises, produces commands, reads history."""
