//! allot's Kubernetes API: the committed CRDs, the objects' shapes and conversions. One test
//! binary for the crate (one link, not one per file).

mod crds;
mod facade;
mod fleet;
mod objects;
