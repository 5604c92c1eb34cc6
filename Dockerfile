# The bc-workers image: `bcw` as entrypoint (`bcw run liveness`, `bcw migrate`, …).
# Multi-stage: dependencies are installed in a builder; the final stage has the virtual
# environment only, runs as a non-root user, and needs no writable root filesystem.

# The base image pinned by digest (python:3.11-slim, the multi-arch index): a rebuild gets
# the same bytes. To move it, read the current digest with
# `docker buildx imagetools inspect python:3.11-slim` and build with --build-arg PYTHON_IMAGE=…
# (or change it here). Every Python package comes pinned from constraints.txt.
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY schemas ./schemas
COPY workers ./workers
COPY migrations ./migrations
RUN python -m venv /opt/bcw \
 && /opt/bcw/bin/pip install --constraint constraints.txt ".[grpc]" \
 && /opt/bcw/bin/python -c "import workers, schemas; from workers.runtime.store.migrate import default_directory as d; assert (d() / '0001_clock.sql').exists()"

FROM ${PYTHON_IMAGE}
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
