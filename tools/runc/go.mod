// Build glue only: pins runc, the OCI runtime containerd's shim runs containers with. No code of
// allot's lives here. containerd 2.4 is tested against runc 1.5 (Debian 12's 1.1.5 is far older).
// runc needs cgo (its nsenter is C) and links libseccomp (the `seccomp` build tag), statically
// here; its version comes from its embedded VERSION file.
module allot.dev/tools/runc

go 1.25.0

require github.com/opencontainers/runc v1.5.3
