//! allot-controller: garbage collection, pool lifecycle, subnet auto-pools and admission
//! webhooks for a cluster, one leader at a time.

fn main() {}
