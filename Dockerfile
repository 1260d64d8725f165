# The image docker-compose.yml runs pgjobs (migrate, worker, producer, api) from; the web extra
# is for `pgjobs serve` (the api service).
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE alembic.ini ./
COPY pgjobs ./pgjobs
COPY examples ./examples
RUN pip install --no-cache-dir ".[web]" \
    && groupadd --gid 10001 pgjobs \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin pgjobs
# A numeric user, as Kubernetes' runAsNonRoot can check (deploy/kubernetes/ runs it as 10001:10001).
# pgjobs writes no file when given a database (migrate, work, serve): the files above stay root's.
USER 10001:10001
# pip compiled the installed code's bytecode; the rest (examples/) is compiled in memory.
ENV PYTHONDONTWRITEBYTECODE=1
# 8080: `pgjobs serve`; 9090: a worker's /healthz, /readyz, /stats and /metrics
# (`--http 0.0.0.0:9090`: a port alone listens on the container's loopback only).
EXPOSE 8080 9090
ENTRYPOINT ["pgjobs"]
