"""The web extra stays out of every process that does not serve HTTP: `import pgjobs.cli` (every
command) and the worker load none of FastAPI, Starlette, uvicorn, pydantic, prometheus-client or
Jinja2; `pgjobs serve` imports them inside the command. And a server loads what only some routes
need on the first request for them: the metrics, the worker's outcome path."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest

from tests.support.helpers import pgjobs_process, wait_until
from tests.web.conftest import AUTH, TOKEN

WEB_MODULES = ("fastapi", "starlette", "uvicorn", "pydantic", "prometheus_client", "jinja2")

CHECK = """
import sys
{imports}
print(",".join(sorted(m for m in {modules!r} if m in sys.modules)))
"""


@pytest.mark.parametrize(
    "imports",
    [
        "import pgjobs",
        "import pgjobs.cli",
        "from pgjobs.cli import serve",
        "from pgjobs.worker import Worker",
        "import pgjobs.browse",
    ],
)
def test_web_libraries_stay_out(imports: str) -> None:
    code = CHECK.format(imports=imports, modules=WEB_MODULES)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_the_web_package_loads_them() -> None:
    code = CHECK.format(imports="import pgjobs.web", modules=WEB_MODULES)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert {"fastapi", "pydantic", "starlette"} <= set(result.stdout.strip().split(","))


def test_jinja2_waits_for_the_first_dashboard_page() -> None:
    """A server that only answers the API never loads the templates' engine (~2 MiB)."""
    built = (
        "from pgjobs.web import create_app\n"
        "create_app(dsn='postgresql://u@127.0.0.1:1/db', tokens=['a' * 32])"
    )
    code = CHECK.format(imports=built, modules=("jinja2",))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
    shown = built + "\nfrom pgjobs.web.dashboard import frame\nframe._environment()"
    code = CHECK.format(imports=shown, modules=("jinja2",))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "jinja2"


#: What a server that answers the API's enqueues and its probes never loads: the dashboard's
#: templates, the queue metrics with prometheus_client, the worker's outcome path.
DEFERRED = (
    "jinja2",
    "prometheus_client",
    "pgjobs.web.metrics",
    "pgjobs.web.gauges",
    "pgjobs.completer",
)


def test_create_app_loads_none_of_what_some_routes_need() -> None:
    built = (
        "from pgjobs.web import create_app\n"
        "create_app(dsn='postgresql://u@127.0.0.1:1/db', tokens=['a' * 32])"
    )
    code = CHECK.format(imports=built, modules=DEFERRED)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def _imported(stderr: str) -> set[str]:
    """The modules a process imported, from its ``-X importtime`` lines."""
    return {
        line.rpartition("|")[2].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:")
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_loads_the_metrics_on_their_first_request(
    subprocess_env: dict[str, str],
) -> None:
    """A real `pgjobs serve` that answered /readyz and an enqueue loaded none of ``DEFERRED``;
    a scrape then loads the metrics."""
    env = {**subprocess_env, "PGJOBS_API_TOKENS": TOKEN, "PYTHONPROFILEIMPORTTIME": "1"}
    base = f"http://127.0.0.1:{_free_port()}"
    port = base.rpartition(":")[2]
    with pgjobs_process(env, "serve", "--port", port, "--pool-size", "2") as server:

        def ready() -> httpx.Response | None:
            try:
                response = httpx.get(f"{base}/readyz", timeout=2)
            except httpx.TransportError:
                return None
            return response if response.status_code == 200 else None

        wait_until(ready, timeout=30, what="/readyz", procs=[server])
        created = httpx.post(f"{base}/api/v1/jobs", json={"task": "t"}, headers=AUTH)
        assert created.status_code == 201, created.text
        imported = _imported(server.err())
        assert "fastapi" in imported  # the lines are there to read
        assert sorted(m for m in imported if m.startswith(DEFERRED)) == []
        assert httpx.get(f"{base}/metrics", headers=AUTH).status_code == 200
        imported = _imported(server.err())
        assert {"prometheus_client", "pgjobs.web.metrics"} <= imported
        assert server.stop() == 0
