# fumarole: one image with both binaries, fumarole-agent (the DaemonSet) and
# fumarole-scheduler-ext (the extender). Build from the repository root:
#   docker build -t ghcr.io/fumarole-dev/fumarole:0.1.0 .
# The target vc-scheduler-fumarole is a second image: Volcano's scheduler with fumarole's plugin
# compiled in (volcano-plugin/build.sh), a drop-in for volcano-scheduler's image:
#   docker build --target vc-scheduler-fumarole -t ghcr.io/fumarole-dev/vc-scheduler-fumarole:0.1.0 .
# The target kube-scheduler-fumarole is a third: kube-scheduler with fumarole's framework plugin
# compiled in (kube-plugin/build.sh), run as deploy/kube-plugin shows:
#   docker build --target kube-scheduler-fumarole -t ghcr.io/fumarole-dev/kube-scheduler-fumarole:0.1.0 .
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

# Go for cgo: Volcano's scheduler links the decision core (scheduler-abi, a Rust static library).
FROM rust:1.95-bookworm AS build-vc-scheduler
COPY --from=golang:1.24-bookworm /usr/local/go /usr/local/go
ENV PATH=/usr/local/go/bin:$PATH CARGO_TARGET_DIR=/src/target
WORKDIR /src
COPY . .
RUN volcano-plugin/build.sh --release --locked \
 && cp target/release/vc-scheduler-fumarole /usr/local/bin/

# Links only glibc (no hwloc). The entrypoint is the binary, as in Volcano's own image, so
# volcano-scheduler's Deployment keeps its arguments.
FROM debian:bookworm-slim AS vc-scheduler-fumarole
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-vc-scheduler /usr/local/bin/vc-scheduler-fumarole /usr/local/bin/
ENTRYPOINT ["vc-scheduler-fumarole"]

# kube-scheduler's go.mod asks for Go 1.26.
FROM rust:1.95-bookworm AS build-kube-scheduler
COPY --from=golang:1.26-bookworm /usr/local/go /usr/local/go
ENV PATH=/usr/local/go/bin:$PATH CARGO_TARGET_DIR=/src/target
WORKDIR /src
COPY . .
RUN kube-plugin/build.sh --release --locked \
 && cp target/release/kube-scheduler-fumarole /usr/local/bin/

# Links only glibc. deploy/kube-plugin runs it with --config.
FROM debian:bookworm-slim AS kube-scheduler-fumarole
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-kube-scheduler /usr/local/bin/kube-scheduler-fumarole /usr/local/bin/
USER 65532
ENTRYPOINT ["kube-scheduler-fumarole"]

# The default target (last): the agent and the extender.
FROM debian:bookworm-slim AS fumarole
# libhwloc15 is the hwloc runtime the agent links; ca-certificates for the API server's CA
# bundle fallbacks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libhwloc15 libudev1 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/fumarole-agent /usr/local/bin/fumarole-scheduler-ext /usr/local/bin/
ENTRYPOINT ["fumarole-agent"]
