"""The web extra stays out of every process that does not serve HTTP: `import pgjobs.cli` (every
command) and the worker load none of FastAPI, Starlette, uvicorn, pydantic, prometheus-client or
Jinja2; `pgjobs serve` imports them inside the command."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
