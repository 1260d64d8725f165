# migrations/env.py of an application that runs pgjobs' migrations in its own `alembic upgrade`.
# tests/acceptance/test_wheel.py runs this file as the env.py of an Alembic project, with pgjobs
# installed from its wheel.
from alembic import context
from sqlalchemy import create_engine, pool

import pgjobs.db.dsn
import pgjobs.migrate


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url, "alembic.ini sets sqlalchemy.url"
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=None)
        with context.begin_transaction():
            context.run_migrations()
    # pgjobs' migrations, in the same `alembic upgrade`, with their own version table.
    pgjobs.migrate.upgrade(pgjobs.db.dsn.normalize_dsn(url, "alembic.ini"), lock_timeout="5s")


run_migrations_online()
