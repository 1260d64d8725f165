"""What a worker process loads: Alembic and SQLAlchemy (~24 MiB resident) are for migrations
only, so `pgjobs work` and `import pgjobs` must not import them."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
{imports}
loaded = sorted(m for m in ("alembic", "sqlalchemy") if m in sys.modules)
print(",".join(loaded))
"""


@pytest.mark.parametrize(
    "imports",
    [
        "import pgjobs",
        "import pgjobs.cli",
        "from pgjobs.worker import Worker; from pgjobs import migrate; migrate.head()",
    ],
)
def test_worker_code_does_not_load_migration_libraries(imports):
    result = subprocess.run(
        [sys.executable, "-c", CHECK.format(imports=imports)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == ""


def test_migration_commands_still_load_them():
    code = CHECK.format(imports="from pgjobs import migrate; migrate.migrations_head()")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "alembic,sqlalchemy"
