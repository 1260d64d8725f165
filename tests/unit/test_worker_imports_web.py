"""A plain worker loads nothing of the web extra: `pgjobs work` (with or without --http, with
external tasks) must not import the HTTP framework, the server, the metrics library, the template
engine or the HTTP client that `pgjobs serve` uses."""

from __future__ import annotations

import subprocess
import sys

import pytest

WEB_LIBRARIES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "prometheus_client",
    "jinja2",
    "httpx",
)

CHECK = """
import sys
{imports}
loaded = sorted(m for m in {libraries!r} if m in sys.modules)
print(",".join(loaded))
"""


@pytest.mark.parametrize(
    "imports",
    [
        "import pgjobs",
        "import pgjobs.cli",
        "import pgjobs.worker, pgjobs.worker.http, pgjobs.worker.external",
        # What `pgjobs work --http ... --external-url ...` builds before it runs.
        "import pgjobs\n"
        "from pgjobs.cli import work\n"
        "app = pgjobs.App('postgresql://nobody@127.0.0.1:1/none')\n"
        "app.external_task('t', url='https://downstream.internal/jobs')\n"
        "w = pgjobs.Worker(app, pgjobs.WorkerConfig(http=('127.0.0.1', 0)))\n"
        "w.metrics.render(busy=0, connected=True)",
    ],
)
def test_the_worker_does_not_load_the_web_extra(imports):
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(imports=imports, libraries=WEB_LIBRARIES)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == ""


def test_the_check_sees_a_web_library_when_one_is_loaded():
    code = CHECK.format(imports="import prometheus_client", libraries=WEB_LIBRARIES)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "prometheus_client"
