# In your env.py: keep Alembic's autogenerate from proposing to drop pgjobs' tables.
# tests/integration/schema/test_migrations.py checks it against pgjobs' tables and partitions.
from typing import Any

from pgjobs.schema import metadata as pgjobs_metadata


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    pgjobs_table = name is not None and (
        name in pgjobs_metadata.tables
        or name.startswith("archived_jobs_")
        or name == "pgjobs_alembic_version"
    )
    return not (type_ == "table" and pgjobs_table)
