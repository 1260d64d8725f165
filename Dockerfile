# The image docker-compose.yml runs pgjobs (migrate, worker, producer, api) from; the web extra
# is for `pgjobs serve` (the api service).
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE alembic.ini ./
COPY pgjobs ./pgjobs
COPY examples ./examples
RUN pip install --no-cache-dir ".[web]" && useradd --create-home pgjobs
USER pgjobs
# 8080: `pgjobs serve`; 9090: a worker's /healthz, /readyz, /stats and /metrics (`--http` or $PORT).
EXPOSE 8080 9090
ENTRYPOINT ["pgjobs"]
