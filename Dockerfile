# The bc-workers image: `bcw` as entrypoint (`bcw run liveness`, `bcw migrate`, …).
# Multi-stage: dependencies are installed in a builder; the final stage has the virtual
# environment only, runs as a non-root user, and needs no writable root filesystem.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY workers ./workers
COPY migrations ./migrations
RUN python -m venv /opt/bcw \
 && /opt/bcw/bin/pip install --upgrade pip \
 && /opt/bcw/bin/pip install ".[grpc]" \
 && /opt/bcw/bin/python -c "import workers, schemas; from workers.runtime.store.migrate import default_directory as d; assert (d() / '0001_clock.sql').exists()"

FROM python:3.11-slim
ARG VERSION=dev
LABEL org.opencontainers.image.title="bc-workers" \
      org.opencontainers.image.description="Event-driven controller workers of the bc fleet control plane" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/bcw/bin:$PATH \
    HOME=/home/bcw \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --gid 10001 bcw \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/bcw --shell /usr/sbin/nologin bcw
COPY --from=build /opt/bcw /opt/bcw
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["bcw"]
CMD ["--help"]
