"""FastAPI with pgjobs: the App lives as long as the application (opened lazily, closed by the
lifespan), and a request writes its row and enqueues its job in one SQLAlchemy transaction, so
the job exists if and only if the row does.

    PGJOBS_DATABASE_URL=postgresql://... uvicorn examples.integrations.fastapi_app:api
    pgjobs work --app examples.integrations.fastapi_app:jobs
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import pgjobs

DATABASE_URL = os.environ.get("PGJOBS_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
engine = create_async_engine(DATABASE_URL.replace("postgresql://", "postgresql+psycopg://", 1))
jobs = pgjobs.App(DATABASE_URL)


@jobs.task(name="signup.welcome", queue="emails")
async def send_welcome(user_id: int) -> None:
    """Send the welcome e-mail (here: nothing)."""


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS example_users (id bigserial PRIMARY KEY, email text UNIQUE)"
            )
        )
    yield
    await jobs.aclose()  # the async pool belongs to this event loop
    await engine.dispose()


api = FastAPI(lifespan=lifespan)


class Signup(BaseModel):
    email: str


@api.post("/signup", status_code=201)
async def signup(body: Signup) -> dict[str, int]:
    try:
        async with AsyncSession(engine) as session, session.begin():
            user_id = (
                await session.execute(
                    text("INSERT INTO example_users (email) VALUES (:email) RETURNING id"),
                    {"email": body.email},
                )
            ).scalar_one()
            # The session's connection: the job commits (or rolls back) with the user's row.
            job_id = await jobs.enqueue_async(
                send_welcome, {"user_id": user_id}, connection=await session.connection()
            )
    except IntegrityError:
        raise HTTPException(409, f"{body.email} has already signed up") from None
    return {"user_id": user_id, "job_id": job_id}
