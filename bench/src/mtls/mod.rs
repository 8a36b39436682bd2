//! proxy-load's mTLS scenario (issue 38): certificates from weft's mesh CA, a generator of full
//! TLS handshakes, and the scenario's report. The peers are started by
//! `peers::Target::start` (`mtls: true`); the scenario's loop is in `bin/proxy-load.rs`.

pub mod handshake;
pub mod pki;
pub mod report;
