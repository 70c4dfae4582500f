# The hmdp node image: built in a full Rust image, run from a slim one that
# holds only the node's binary, `hmdp-server` (serve and migrate; migrations
# and Lua scripts are compiled into it; no tools, no test kit).

FROM rust:1-slim-bookworm AS build
WORKDIR /src
# The whole source tree (less .dockerignore): cargo reads every target the
# manifest declares (benches included) even to build one binary, the
# workspace's crates/ included, and the binary embeds migrations/, lua/ and
# crates/hmdp-lock/lua/.
COPY . .
RUN cargo build --release --locked -p hmdp --bin hmdp-server

FROM debian:bookworm-slim
# curl: the compose health check asks the node's /ready.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home hmdp
COPY --from=build /src/target/release/hmdp-server /usr/local/bin/hmdp-server
# Numeric, so that Kubernetes can verify runAsNonRoot (deploy/kubernetes).
USER 10001
# Inside a container the node must listen on every interface, not loopback.
ENV HMDP_HOST=0.0.0.0 HMDP_PORT=8081
EXPOSE 8081
ENTRYPOINT ["hmdp-server"]
CMD ["serve"]
