// Build glue only: pins containerd 2.x (containerd, its runc shim containerd-shim-runc-v2, and
// ctr), the container runtime the real nodes of the tests run under the kubelet (CRI plugin).
// No code of allot's lives here. Built pure Go (CGO_ENABLED=0) with the tags containerd's
// Makefile uses to leave out what needs cgo or is not used (see scripts/build-upstream.sh).
module allot.dev/tools/containerd

go 1.26.6

require github.com/containerd/containerd/v2 v2.4.2
