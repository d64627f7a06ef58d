# fumarole: one image with both binaries, fumarole-agent (the DaemonSet) and
# fumarole-scheduler-ext (the extender). Build from the repository root:
#   docker build -t ghcr.io/fumarole-dev/fumarole:0.1.0 .
# NVML (libnvidia-ml.so.1) is not in the image: the agent loads it at run time from the host,
# where the NVIDIA container toolkit mounts it; without it NVIDIA links come from the PCI tree.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libhwloc-dev libudev-dev pkg-config protobuf-compiler \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p fumarole-agent -p fumarole-scheduler-ext \
 && cp target/release/fumarole-agent target/release/fumarole-scheduler-ext /usr/local/bin/

FROM debian:bookworm-slim
# libhwloc15 is the hwloc runtime the agent links; ca-certificates for the API server's CA
# bundle fallbacks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libhwloc15 libudev1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/fumarole-agent /usr/local/bin/fumarole-scheduler-ext /usr/local/bin/
ENTRYPOINT ["fumarole-agent"]
