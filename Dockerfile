# syntax=docker/dockerfile:1
# Multi-stage build: wheels in a builder, a slim non-root runtime with a health check.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 FLEETGATE_HOST=0.0.0.0 FLEETGATE_PORT=8080
RUN useradd --create-home --uid 10001 fleetgate
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
WORKDIR /home/fleetgate
# numba compiles the routing kernels once and caches them here (writable by the user; the
# installed package is not); compiling at build time makes the first start quick.
ENV NUMBA_CACHE_DIR=/home/fleetgate/.cache/numba
RUN python -c "import fleetgate.routing"
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["fleetgate", "serve"]
