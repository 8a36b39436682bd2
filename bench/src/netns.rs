//! A network namespace of the bench's own, with nothing in it but a loopback that is up.
//!
//! Why: the host's loopback carries the firewall of whatever else runs on the machine. Here that
//! is Docker's iptables chains and connection tracking: `perf` puts `ipt_do_table`,
//! `nf_hook_slow` and the conntrack lookups at ≈ 8% of the load core's cycles, a tax on every
//! packet that every proxy and the load generator pay alike, and that moves with the host's
//! configuration rather than with the proxies. A fresh namespace has no rules, as a pod's
//! namespace has none for a sidecar that its app addresses directly (weft's outbound listener,
//! no iptables redirect). Loopback tests are unaffected in kind: 127.0.0.0/8 only.
//!
//! The namespace belongs to the calling thread and to every process it spawns afterwards;
//! threads started earlier stay outside, so enter it from the thread that starts the proxies,
//! the upstream and the load generators, after anything that needs the network (installs).
//!
//! `unsafe` is allowed here for the two syscalls (unshare, the interface-flag ioctls) that std
//! does not wrap; each block says why it is sound.
#![allow(unsafe_code)]

use std::io;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::fd::AsRawFd;

use anyhow::{Context, Result};

/// Moves the calling thread, and every process it spawns from now on, into a new network
/// namespace and brings its loopback up. Needs root (CAP_SYS_ADMIN).
pub fn enter_private() -> Result<()> {
    // SAFETY: unshare takes flags only; it changes this thread's namespaces, nothing in memory.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error())
            .context("unshare(CLONE_NEWNET) (a private network namespace needs root)");
    }
    loopback_up().context("bringing up the private namespace's loopback")
}

/// `ip link set lo up`, without depending on iproute2: SIOCGIFFLAGS, set IFF_UP, SIOCSIFFLAGS.
fn loopback_up() -> io::Result<()> {
    // Any AF_INET socket takes the interface ioctls; an unconnected UDP one needs no interface up.
    let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = src as libc::c_char;
    }
    // SAFETY: both ioctls read and write only `req`, which outlives the calls.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// In a thread of its own (the namespace is per thread, and the test harness's other
    /// threads must keep the host's): after entering, loopback works and a listener on the
    /// host's loopback is out of reach.
    #[test]
    fn private_loopback_is_up_and_separate() {
        let host = TcpListener::bind("127.0.0.1:0").unwrap();
        let host_addr = host.local_addr().unwrap();
        let inside = std::thread::spawn(move || -> Option<(bool, bool)> {
            if let Err(e) = enter_private() {
                eprintln!("skipped: {e:#}");
                return None;
            }
            let own = TcpListener::bind("127.0.0.1:0").unwrap();
            let own_ok = TcpStream::connect(own.local_addr().unwrap()).is_ok();
            let host_reachable = TcpStream::connect(host_addr).is_ok();
            Some((own_ok, host_reachable))
        })
        .join()
        .unwrap();
        if let Some((own_ok, host_reachable)) = inside {
            assert!(own_ok, "the private loopback accepts connections");
            assert!(!host_reachable, "the host's loopback is not visible inside");
        }
        assert!(TcpStream::connect(host_addr).is_ok(), "this thread stayed outside");
    }
}
