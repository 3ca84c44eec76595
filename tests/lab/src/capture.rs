//! Frames seen on one interface while a capture runs: a raw `AF_PACKET` socket bound to the
//! interface, in a network namespace of the caller's choice (on a thread of its own: setns
//! changes only the calling thread), for tests that check what goes on a link (probes,
//! announcements).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

pub struct Capture {
    stop: Arc<AtomicBool>,
    frames: Arc<Mutex<Vec<Vec<u8>>>>,
    thread: thread::JoinHandle<()>,
}

impl Capture {
    /// Starts capturing every frame on `ifname` of the network namespace pinned at `netns`
    /// (`None`: the caller's own); returns once the socket is bound.
    pub fn start(netns: Option<&Path>, ifname: &str) -> Capture {
        let netns = netns.map(|p| File::open(p).unwrap());
        let ifname = CString::new(ifname).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let frames = Arc::new(Mutex::new(Vec::new()));
        let (ready, started) = std::sync::mpsc::channel();
        let (stopped, into) = (stop.clone(), frames.clone());
        let thread = thread::spawn(move || {
            // SAFETY: plain syscalls on descriptors this thread owns; the socket address and
            // the timeout are fully initialised structs of the sizes passed.
            unsafe {
                if let Some(ns) = &netns {
                    assert_eq!(libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET), 0);
                }
                let all = (libc::ETH_P_ALL as u16).to_be();
                let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(all));
                assert!(fd >= 0, "{}", std::io::Error::last_os_error());
                let index = libc::if_nametoindex(ifname.as_ptr());
                assert!(index > 0, "no interface {ifname:?}");
                let mut sll: libc::sockaddr_ll = std::mem::zeroed();
                sll.sll_family = libc::AF_PACKET as u16;
                sll.sll_protocol = all;
                sll.sll_ifindex = index as i32;
                let bound = libc::bind(
                    fd,
                    (&raw const sll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
                assert_eq!(bound, 0, "{}", std::io::Error::last_os_error());
                let tv = libc::timeval {
                    tv_sec: 0,
                    tv_usec: 20_000,
                };
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&raw const tv).cast(),
                    std::mem::size_of::<libc::timeval>() as u32,
                );
                ready.send(()).unwrap();
                let mut buf = [0u8; 2048];
                loop {
                    let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
                    if n > 0 {
                        into.lock().unwrap().push(buf[..n as usize].to_vec());
                    } else if stopped.load(Ordering::SeqCst) {
                        // Stopped, and nothing left queued.
                        break;
                    }
                }
                libc::close(fd);
            }
        });
        started.recv().unwrap();
        Capture {
            stop,
            frames,
            thread,
        }
    }

    /// The frames seen so far.
    pub fn frames(&self) -> Vec<Vec<u8>> {
        self.frames.lock().unwrap().clone()
    }

    /// Stops, and returns every frame seen.
    pub fn finish(self) -> Vec<Vec<u8>> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        std::mem::take(&mut *self.frames.lock().unwrap())
    }
}
