# syntax=docker/dockerfile:1
# One image for every component of allot: allot-agent, allot-controller, allotctl, the CNI plugin
# `allot` (which the chart's init container copies onto each node) and the default policy
# component (which the chart's Policy names). Build it with `make image`.
#
# Multi-stage: the build stage has the Rust toolchain, the wasm32-wasip2 target (the default
# policy is a WebAssembly component) and protoc (etcd-client's build script); the runtime stage
# is distroless (glibc and libgcc, no shell, no package manager) and runs as a non-root user.
# The agent alone runs as root, as the chart says and why: the plugin, which the container
# runtime runs as root on the node, must reach its socket.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
# The plugin runs on the node, against whatever C library the node has, not in this image:
# linked statically, as CNI plugins are.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    triple="$(rustc -vV | sed -n 's/^host: //p')" \
 && RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p allot-cni \
        --target "$triple" --target-dir target/static \
 && cargo build --release --locked -p allot-agent -p allot-controller -p allot-cli \
 && mkdir -p /out/bin /out/policies \
 && cp "target/static/$triple/release/allot" target/release/allot-agent \
       target/release/allot-controller target/release/allotctl /out/bin/ \
 && cp target/wasm-default-policy/wasm32-wasip2/release/allot_policy_default.wasm \
       /out/policies/default.wasm

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="allot" \
      org.opencontainers.image.description="IPAM for Kubernetes underlay networks with a WebAssembly pool-selection policy" \
      org.opencontainers.image.source="https://github.com/allot-ipam/allot" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/policies/default.wasm /usr/lib/allot/policies/default.wasm
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/allotctl"]
CMD ["--help"]
