"""The web UI, served by the API under ``/ui`` (docs: docs/ui.md).

Server-rendered Jinja2 pages and a little vanilla JavaScript, no build step. The UI has
no business logic of its own: every page and every button goes through the JSON API's
own routes, called in-process with the signed-in user's bearer token
(``backend.ApiBackend``), so validation, tenant isolation, limits and errors are the
API's. The token is kept in an HttpOnly, SameSite=Strict cookie that only ``/ui``
routes accept (``session``); requests that change something also carry a CSRF token.
"""

from gnomon.ui.routes import install

__all__ = ["install"]
