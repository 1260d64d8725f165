"""Dependency names: a job enqueued with ``after={"charge": 41, "stock": 42}`` reads its
dependencies' results by those names

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02

* ``pgjobs_dependencies.name``: the name the dependent gave the job it waits for (NULL: named
  by id only, as every edge written before this revision).

Online safety: a nullable column without a default is a catalog change in one short
transaction; no row is rewritten. Producers of the previous release write their edges without a
name, as before. Downgrade drops the column (the names are lost; the edges stay).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pgjobs_dependencies", sa.Column("name", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("pgjobs_dependencies", "name")
