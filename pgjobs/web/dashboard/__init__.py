"""The web dashboard of `pgjobs serve`: overview, dead letters, jobs and queues in a browser.

``create_app`` includes ``dashboard_router(...)`` beside the HTTP API; the pages call the same
functions the API calls (``pgjobs.stats``, ``pgjobs.admin``, ``pgjobs.browse``), never the API
over HTTP. See ``routes`` for the route table, ``frame`` for what every page shares, ``pages``
for the pages and actions, and ``security`` for sessions and CSRF.

Example::

    from pgjobs import db
    from pgjobs.web.auth import load_tokens
    from pgjobs.web.dashboard import dashboard_router

    api.include_router(dashboard_router(lambda: db.pooled(pool, dsn), tokens=load_tokens()))
"""

from __future__ import annotations

from pgjobs.web.dashboard.frame import ConnectionSource
from pgjobs.web.dashboard.routes import Dashboard, dashboard_router

__all__ = ["ConnectionSource", "Dashboard", "dashboard_router"]
