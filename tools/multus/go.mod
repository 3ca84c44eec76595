// Build glue only: pins Multus's thin CNI plugin (the `multus` binary the runtime execs, which
// reads NetworkAttachmentDefinitions through a kubeconfig and delegates to other plugins), for
// the tests that run allot behind Multus. No code of allot's lives here. The proxy lists no
// versions of this gopkg.in path: v4.2.3 is pinned exactly.
module allot.dev/tools/multus

go 1.24

require gopkg.in/k8snetworkplumbingwg/multus-cni.v4 v4.2.3
