# syntax=docker/dockerfile:1
#
# NOTE: this image is not built in CI (the CI machine has no container engine). Build and try it
# locally before relying on it:
#   docker build -t outbox-relay .
#   docker run --rm -e DATABASE_URL=postgres://... -e NATS_URL=nats://... -p 9464:9464 outbox-relay
#   docker run --rm -e DATABASE_URL=postgres://... outbox-relay migrate
#
# Keep target/ out of the build context (a .dockerignore with `target/` and `.git/`), or the
# context upload takes a while.

# ---- build ----
FROM rust:1-bookworm AS builder
WORKDIR /build

# Everything `cargo build` reads: the workspace's manifests (the command's names the test and bench
# targets, the harness crate is a member), the library, the command, and the SQL compiled in.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY sql ./sql
COPY cli ./cli
COPY testkit ./testkit
COPY tests ./tests
COPY benches ./benches

# `--features otel`: spans exported over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set, nothing
# otherwise (plain HTTP, no OpenSSL; a few MB of binary).
# The cache mounts keep the registry and compiled dependencies between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/build/target \
    cargo build --release --locked -p outbox-relay-cli --features otel --bin outbox-relay \
    && install -m 0755 target/release/outbox-relay /usr/local/bin/outbox-relay

# ---- runtime ----
FROM debian:bookworm-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 outbox \
    && useradd --system --uid 10001 --gid outbox --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin outbox

COPY --from=builder /usr/local/bin/outbox-relay /usr/local/bin/outbox-relay

# The relay's default metrics address is loopback; in a container it must listen on all interfaces
# for Prometheus and the orchestrator's probes (/metrics, /healthz, /readyz).
ENV OUTBOX_METRICS_ADDR=0.0.0.0:9464 \
    OUTBOX_LOG_FORMAT=json
EXPOSE 9464

USER 10001:10001
# SIGTERM (docker stop) lets the relay finish its batch; give it up to 30 s: `docker stop -t 30`.
STOPSIGNAL SIGTERM
ENTRYPOINT ["outbox-relay"]
CMD ["run"]
