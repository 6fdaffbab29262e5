"""Calls out of gnomon to an address a tenant gave: the SSRF guard (``netguard``), the
HTTP policy, pinning, signing and redaction (``http``) and the secrets a call may carry
(``secrets``). The workers (HTTP targets, commands, containers) and the alerter (webhooks)
both use it; neither imports the other."""
