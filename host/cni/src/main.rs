//! `allot`, the CNI IPAM plugin: see the library (`src/lib.rs`) for what it does.

fn main() {
    std::process::exit(allot_cni::cmd::main_guarded());
}
