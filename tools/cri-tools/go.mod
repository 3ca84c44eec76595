// Build glue only: pins crictl (cri-tools), to inspect the CRI runtime of the tests' real nodes
// when debugging. No code of allot's lives here.
module allot.dev/tools/cri-tools

go 1.26.6

require sigs.k8s.io/cri-tools v1.37.0
