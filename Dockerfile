# The image docker-compose.yml runs pgjobs (migrate, worker, producer) from.
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY pgjobs ./pgjobs
COPY examples ./examples
RUN pip install --no-cache-dir . && useradd --create-home pgjobs
USER pgjobs
ENTRYPOINT ["pgjobs"]
