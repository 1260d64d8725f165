"""The HTTP API of pgjobs (``pip install 'pgjobs-queue[web]'``): ``create_app`` builds it as a
FastAPI application, which `pgjobs serve` runs on uvicorn and which you may mount in your own.

Example: ``uvicorn.run(pgjobs.web.create_app(app), port=8080)``
"""

from __future__ import annotations

from pgjobs.web.app import create_app
from pgjobs.web.principal import Principal, Role

__all__ = ["Principal", "Role", "create_app"]
