//! Ports for a replica's server, sidecar admin and sidecar inbound listener: free on this node
//! now, not held by another replica, picked at random from the agent's `--ports` range (keep
//! it out of the kernel's ephemeral range, where a port released and bound again later may
//! meanwhile be an outgoing connection's source port).

use std::ops::Range;

/// `n` distinct ports of `range` that bind on 127.0.0.1 now and are not in `taken`; fewer if
/// the range runs out.
pub fn pick(range: Range<u16>, n: usize, taken: &[u16]) -> Vec<u16> {
    let mut got: Vec<u16> = Vec::with_capacity(n);
    if range.is_empty() {
        return got;
    }
    for _ in 0..(range.len() * 2).min(10_000) {
        if got.len() == n {
            break;
        }
        let p = rand::random_range(range.clone());
        if !taken.contains(&p) && !got.contains(&p) && std::net::TcpListener::bind(("127.0.0.1", p)).is_ok() {
            got.push(p);
        }
    }
    got
}

#[cfg(test)]
mod tests {
    #[test]
    fn picked_ports_are_distinct_free_and_not_taken() {
        let got = super::pick(40_000..40_010, 3, &[40_001, 40_002]);
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|p| (40_000..40_010).contains(p) && *p != 40_001 && *p != 40_002));
        assert!(got[0] != got[1] && got[1] != got[2] && got[0] != got[2]);
        assert!(super::pick(40_000..40_002, 3, &[]).len() <= 2);
    }
}
