// Build glue only: pins the etcd server the real-cluster tests (and the etcd store's tests) run.
// Its own module, apart from tools/controlplane: built together, Go's version selection would
// move Kubernetes' etcd client. `go install go.etcd.io/etcd/server/v3@…` is refused (the module
// has replace directives), but a module that requires it can build its main package.
module allot.dev/tools/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v3.6.16
