//! `allot-lab-node`: the lab's kubelet stand-in for one node (see `allot_lab::node`). The
//! lab's launcher starts it; it also serves as the container helper (`__container`, `__exec`).

fn main() -> anyhow::Result<()> {
    allot_lab::node::main()
}
