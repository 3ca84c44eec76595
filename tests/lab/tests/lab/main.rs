//! The lab's own tests, one test binary (`lab`): each module starts small clusters of its own
//! (the lab's lock runs them one after another across nextest's processes). One binary rather
//! than one per file: each links the whole of kube, tokio and the lab.

mod allot_image;
mod containers;
mod control_plane;
mod loopback;
mod pods;
