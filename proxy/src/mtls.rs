//! Mutual TLS at run time: the sidecar's current credentials (rotated without a restart: a
//! new connection uses the newest, an open one keeps what it shook hands with), how listeners
//! and clusters use them, and the TLS metrics. The rustls configurations themselves are built
//! in [`crate::tls`].

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use rustls::pki_types::ServerName;

use crate::config::{self, ClusterTlsMode, ListenerTlsMode, UpstreamProtocol};
use crate::identity::SpiffeId;
use crate::tls::{self, Credentials, Expect};

/// What TLS a downstream connection came over, for telemetry and authorization.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    Plaintext,
    /// Mutual TLS with a mesh peer, authenticated as this ID.
    Mesh(Arc<str>),
    /// TLS without a client certificate (a `terminate` listener).
    Tls,
}

impl Peer {
    /// The `tls` label and access-log field.
    pub fn mode(&self) -> &'static str {
        match self {
            Peer::Plaintext => "plaintext",
            Peer::Mesh(_) => "mtls",
            Peer::Tls => "tls",
        }
    }

    pub fn identity(&self) -> Option<&str> {
        match self {
            Peer::Mesh(id) => Some(id),
            _ => None,
        }
    }
}

/// The process's TLS context: its mesh identity, if it has one, and the TLS counters.
/// Clusters and listeners hold it; it outlives every config.
#[derive(Default)]
pub struct TlsContext {
    pub mesh: Option<Arc<MeshIdentity>>,
    pub stats: TlsStats,
    /// Compiling only to validate (the control plane checking a resource): files a sidecar
    /// would read (a cluster's `ca_file`) are on the sidecar's machine, not looked at here.
    validate_only: bool,
}

impl TlsContext {
    pub fn new(identity: Option<&config::Identity>) -> Result<Arc<TlsContext>, String> {
        let mesh = identity.map(MeshIdentity::from_config).transpose()?.map(Arc::new);
        Ok(Arc::new(TlsContext { mesh, stats: TlsStats::default(), validate_only: false }))
    }

    /// A context with no identity, to validate configs that do not run here.
    pub fn none() -> Arc<TlsContext> {
        Arc::new(TlsContext { validate_only: true, ..TlsContext::default() })
    }
}

/// `revocations[]` as a sidecar can use them: unique names, a SPIFFE ID, a time.
pub fn check_revocations(cfg: &config::Config) -> Result<(), String> {
    let mut names = std::collections::HashSet::new();
    for r in &cfg.revocations {
        if r.name.is_empty() || !names.insert(r.name.as_str()) {
            return Err(format!("revocations: every entry needs a unique, non-empty name ({:?})", r.name));
        }
        r.identity.parse::<SpiffeId>().map_err(|e| format!("revocations.{}.identity: {e}", r.name))?;
        if r.issued_before == 0 {
            return Err(format!("revocations.{}.issued_before: give the time (Unix seconds) before which its certificates are revoked", r.name));
        }
    }
    Ok(())
}

/// Checks that need the running sidecar: mesh TLS on a listener or cluster needs an identity.
pub fn check(cfg: &config::Config, has_identity: bool) -> Result<(), String> {
    if has_identity {
        return Ok(());
    }
    for l in &cfg.listeners {
        let mode = match l.tls.mode {
            Some(ListenerTlsMode::Strict) => "strict",
            Some(ListenerTlsMode::Permissive) => "permissive",
            _ => continue,
        };
        return Err(format!("listeners.{}.tls.mode: {mode} needs this sidecar's identity (the identity section)", l.name));
    }
    for c in &cfg.clusters {
        if c.tls.as_ref().is_some_and(|t| t.mode == ClusterTlsMode::Mesh) {
            return Err(format!("clusters.{}.tls.mode: mesh needs this sidecar's identity (the identity section)", c.name));
        }
    }
    Ok(())
}

/// The sidecar's identity and its current credentials.
pub struct MeshIdentity {
    /// As configured; else the first loaded certificate's.
    id: Option<SpiffeId>,
    files: Option<Files>,
    /// Issued by weft-control: the token file and the directory credentials are kept in.
    pub issued: Option<Issued>,
    current: ArcSwapOption<Loaded>,
    /// The files' stamp at the last check: a change is loaded only once the files have stayed
    /// as they are for one check, since tools write the three files one at a time.
    seen: Mutex<Option<Stamp>>,
    /// The files' stamp when they last failed to load: not retried (nor counted) until they
    /// change again.
    failed: Mutex<Option<Stamp>>,
    /// Peers refused for a revoked identity (`revocations[]`), shared by every configuration.
    revoked: tls::Revoked,
}

type Stamp = Vec<(SystemTime, u64)>;

/// Where an issued identity's token comes from and its credentials are kept.
#[derive(Clone, Debug)]
pub struct Issued {
    pub token_file: PathBuf,
    pub dir: PathBuf,
}

impl Issued {
    pub fn key(&self) -> PathBuf {
        self.dir.join("key.pem")
    }
    pub fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
}

#[derive(Clone)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

/// One set of credentials and the configurations made from it.
pub struct Loaded {
    pub creds: Credentials,
    pub id: SpiffeId,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    server: Arc<rustls::ServerConfig>,
    /// Client configurations per accepted servers and pool protocol, made on first use.
    clients: Mutex<HashMap<(Expect, UpstreamProtocol), Arc<rustls::ClientConfig>>>,
    /// The files' modification times and sizes when read, to see a change.
    stamp: Option<Stamp>,
}

impl MeshIdentity {
    pub fn from_config(c: &config::Identity) -> Result<MeshIdentity, String> {
        let id = match c.spiffe_id.as_str() {
            "" => None,
            s => Some(s.parse::<SpiffeId>().map_err(|e| format!("identity.spiffe_id: {e}"))?),
        };
        let named = [(&c.cert_file, "cert_file"), (&c.key_file, "key_file"), (&c.ca_file, "ca_file")];
        let given = named.iter().filter(|(f, _)| !f.is_empty()).count();
        if !c.token_file.is_empty() || !c.dir.is_empty() {
            return MeshIdentity::issued(c, id, given);
        }
        if given != 3 {
            let missing: Vec<_> = named.iter().filter(|(f, _)| f.is_empty()).map(|(_, n)| format!("identity.{n}")).collect();
            return Err(format!("{}: required (the sidecar's certificate, its key and the mesh root, PEM)", missing.join(", ")));
        }
        let files = Files { cert: c.cert_file.clone().into(), key: c.key_file.clone().into(), ca: c.ca_file.clone().into() };
        let me = MeshIdentity { id, files: Some(files.clone()), issued: None, current: ArcSwapOption::empty(), seen: Mutex::default(), failed: Mutex::default(), revoked: tls::Revoked::default() };
        let loaded = me.load_files(&files)?;
        me.current.store(Some(Arc::new(loaded)));
        Ok(me)
    }

    /// Issued by weft-control: starts with what `dir` holds if it is still valid (a restart
    /// while the control plane is down), else with nothing until the first certificate comes.
    fn issued(c: &config::Identity, id: Option<SpiffeId>, files_given: usize) -> Result<MeshIdentity, String> {
        if files_given > 0 {
            return Err("identity: give either cert_file/key_file/ca_file (your own issuer) or token_file/dir (issued by weft-control), not both".into());
        }
        if id.is_none() {
            return Err("identity.spiffe_id: required with token_file (the identity the join token admits)".into());
        }
        if c.token_file.is_empty() || c.dir.is_empty() {
            return Err("identity: token_file and dir go together (the join token, and where issued credentials are kept)".into());
        }
        let issued = Issued { token_file: c.token_file.clone().into(), dir: c.dir.clone().into() };
        std::fs::create_dir_all(&issued.dir).map_err(|e| format!("identity.dir {}: {e}", issued.dir.display()))?;
        let me = MeshIdentity { id, files: None, issued: Some(issued.clone()), current: ArcSwapOption::empty(), seen: Mutex::default(), failed: Mutex::default(), revoked: tls::Revoked::default() };
        let kept = Files { cert: issued.cert(), key: issued.key(), ca: issued.ca() };
        match me.load_files(&kept) {
            Ok(l) if l.not_after > SystemTime::now() => {
                tracing::info!(identity = %l.id, "serving the certificate kept from before the restart until a new one is issued");
                me.install(l);
            }
            Ok(_) => tracing::info!("the kept certificate has expired; waiting for a new one"),
            Err(_) => {}
        }
        Ok(me)
    }

    /// Refuse peers of these revoked identities from now on (`revocations[]`; bad entries were
    /// refused when the config was compiled).
    pub fn set_revocations(&self, list: &[config::Revocation]) {
        let parsed = list
            .iter()
            .filter_map(|r| Some((r.identity.parse().ok()?, SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(r.issued_before))))
            .collect();
        self.revoked.set(parsed);
    }

    /// The sidecar's SPIFFE ID, once known.
    pub fn id(&self) -> Option<SpiffeId> {
        self.id.clone().or_else(|| self.current.load().as_ref().map(|l| l.id.clone()))
    }

    pub fn current(&self) -> Option<Arc<Loaded>> {
        self.current.load_full()
    }

    fn load_files(&self, f: &Files) -> Result<Loaded, String> {
        let read = |p: &PathBuf, what: &str| std::fs::read_to_string(p).map_err(|e| format!("identity.{what} {}: {e}", p.display()));
        let stamp = stamp(f);
        let (cert, key, ca) = (read(&f.cert, "cert_file")?, read(&f.key, "key_file")?, read(&f.ca, "ca_file")?);
        let mut loaded = self.build(&cert, &key, &ca)?;
        loaded.stamp = stamp;
        Ok(loaded)
    }

    /// Credentials from PEM, checked: the leaf must be this sidecar's ID and chain to the root
    /// it comes with.
    pub fn build(&self, chain_pem: &str, key_pem: &str, roots_pem: &str) -> Result<Loaded, String> {
        let creds = Credentials::from_pem(chain_pem, key_pem, roots_pem).map_err(|e| format!("identity: {e}"))?.with_revocations(self.revoked.clone());
        let id = creds.id().ok_or("identity: the certificate has no SPIFFE ID (URI SAN spiffe://TRUST_DOMAIN/ns/NS/sa/NAME or /service/NAME)")?;
        if let Some(want) = &self.id
            && want != &id
        {
            return Err(format!("identity: the certificate is for {id}, not identity.spiffe_id {want}"));
        }
        let not_before = creds.not_before()?;
        let not_after = creds.not_after()?;
        let server = tls::server_config(&creds, id.trust_domain())?;
        // Checked now, not at the first dial: a key that does not match fails here.
        tls::client_config(&creds, Expect { trust_domain: id.trust_domain().into(), ids: vec![] }, b"h2")?;
        Ok(Loaded { creds, id, not_before, not_after, server, clients: Mutex::default(), stamp: None })
    }

    /// Serve `loaded` from now on (new connections; open ones keep theirs).
    pub fn install(&self, loaded: Loaded) {
        self.current.store(Some(Arc::new(loaded)));
    }

    /// Reread the files if they changed since they were read. `Ok(true)`: new credentials are
    /// in use; `Err`: they did not load and the previous ones stay.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let Some(f) = &self.files else { return Ok(false) };
        let now = stamp(f);
        if now.is_none() || self.current.load().as_ref().is_some_and(|c| c.stamp == now) || *self.failed.lock().unwrap() == now {
            return Ok(false);
        }
        let settled = std::mem::replace(&mut *self.seen.lock().unwrap(), now.clone()) == now;
        if !settled {
            return Ok(false);
        }
        let loaded = self.load_files(f).inspect_err(|_| *self.failed.lock().unwrap() = now.clone())?;
        // A rewrite of the same certificate (a tool touching the files) is not a rotation.
        let same = self.current.load().as_ref().is_some_and(|c| c.creds.leaf() == loaded.creds.leaf());
        self.install(loaded);
        Ok(!same)
    }
}

/// Reread the identity's files whenever they change (checked every `every`, loaded once
/// unchanged for one more check); a set that does not load is logged and counted, and the
/// credentials in use stay.
pub async fn watch_files(mesh: Arc<MeshIdentity>, ctx: Arc<TlsContext>, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every.max(std::time::Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        match mesh.reload_if_changed() {
            Ok(false) => {}
            Ok(true) => {
                ctx.stats.reload("rotated");
                if let Some(c) = mesh.current() {
                    let left = c.not_after.duration_since(SystemTime::now()).unwrap_or_default();
                    tracing::info!(identity = %c.id, expires_in_s = left.as_secs(), "mesh certificate rotated");
                }
            }
            Err(e) => {
                ctx.stats.reload("failed");
                tracing::warn!(error = %e, "mesh credentials changed on disk but do not load; keeping the current ones");
            }
        }
    }
}

fn stamp(f: &Files) -> Option<Stamp> {
    [&f.cert, &f.key, &f.ca]
        .iter()
        .map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len()))))
        .collect()
}

impl Loaded {
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.clone()
    }

    /// The client configuration for servers holding one of `ids` (any of this trust domain
    /// when empty), speaking `protocol`.
    pub fn client_config(&self, ids: &[SpiffeId], protocol: UpstreamProtocol) -> Result<Arc<rustls::ClientConfig>, String> {
        let expect = Expect { trust_domain: self.id.trust_domain().to_string(), ids: ids.to_vec() };
        let key = (expect, protocol);
        if let Some(c) = self.clients.lock().unwrap().get(&key) {
            return Ok(c.clone());
        }
        let c = tls::client_config(&self.creds, key.0.clone(), alpn(protocol))?;
        self.clients.lock().unwrap().insert(key, c.clone());
        Ok(c)
    }
}

/// The one ALPN protocol a pool of `protocol` offers.
pub fn alpn(protocol: UpstreamProtocol) -> &'static [u8] {
    match protocol {
        UpstreamProtocol::Http1 => b"http/1.1",
        UpstreamProtocol::Http2 => b"h2",
    }
}

/// A listener's TLS, compiled.
#[derive(Clone)]
pub enum ListenerTls {
    Disabled,
    /// Mutual TLS with the mesh identity; `strict` refuses plaintext.
    Mesh { strict: bool },
    /// The listener's own certificate, no client certificate.
    Terminate(Arc<rustls::ServerConfig>),
}

impl ListenerTls {
    pub fn compile(l: &config::Listener, has_identity: bool) -> Result<ListenerTls, String> {
        let f = format!("listeners.{}.tls", l.name);
        let t = &l.tls;
        let mode = t.mode.unwrap_or(if has_identity && l.direction == config::Direction::Inbound {
            ListenerTlsMode::Strict
        } else {
            ListenerTlsMode::Disabled
        });
        if mode != ListenerTlsMode::Terminate && !(t.cert_file.is_empty() && t.key_file.is_empty()) {
            return Err(format!("{f}: cert_file and key_file are for mode terminate (mesh modes use the identity's)"));
        }
        Ok(match mode {
            ListenerTlsMode::Disabled => ListenerTls::Disabled,
            ListenerTlsMode::Strict => ListenerTls::Mesh { strict: true },
            ListenerTlsMode::Permissive => ListenerTls::Mesh { strict: false },
            ListenerTlsMode::Terminate => {
                let read = |p: &str, what: &str| match p {
                    "" => Err(format!("{f}.{what}: required with mode terminate")),
                    p => std::fs::read_to_string(p).map_err(|e| format!("{f}.{what} {p}: {e}")),
                };
                let (cert, key) = (read(&t.cert_file, "cert_file")?, read(&t.key_file, "key_file")?);
                ListenerTls::Terminate(tls::terminate_config(&cert, &key).map_err(|e| format!("{f}: {e}"))?)
            }
        })
    }

    pub fn mode(&self) -> &'static str {
        match self {
            ListenerTls::Disabled => "disabled",
            ListenerTls::Mesh { strict: true } => "strict",
            ListenerTls::Mesh { strict: false } => "permissive",
            ListenerTls::Terminate(_) => "terminate",
        }
    }
}

/// A cluster's TLS origination, compiled.
pub struct Origin {
    kind: OriginKind,
    /// The server name sent; `None` = the endpoint's host.
    sni: Option<ServerName<'static>>,
    ctx: Arc<TlsContext>,
}

enum OriginKind {
    Mesh(Vec<SpiffeId>),
    /// Roots fixed at compile; ALPN per the cluster's protocol. `None` when only validating.
    Simple(Option<Arc<rustls::ClientConfig>>),
}

impl Origin {
    pub fn compile(c: &config::Cluster, ctx: &Arc<TlsContext>) -> Result<Option<Origin>, String> {
        let Some(t) = &c.tls else { return Ok(None) };
        let f = format!("clusters.{}.tls", c.name);
        let sni = match t.sni.as_str() {
            "" => None,
            s => Some(ServerName::try_from(s.to_string()).map_err(|_| format!("{f}.sni: {s:?} is not a DNS name or IP address"))?),
        };
        let kind = match t.mode {
            ClusterTlsMode::Mesh => {
                if !t.ca_file.is_empty() {
                    return Err(format!("{f}.ca_file: for mode simple (mesh peers chain to the identity's root)"));
                }
                let ids = t
                    .identities
                    .iter()
                    .map(|s| s.parse::<SpiffeId>().map_err(|e| format!("{f}.identities: {e}")))
                    .collect::<Result<_, _>>()?;
                OriginKind::Mesh(ids)
            }
            ClusterTlsMode::Simple => {
                if !t.identities.is_empty() {
                    return Err(format!("{f}.identities: for mode mesh (a simple upstream is checked by its name)"));
                }
                if ctx.validate_only {
                    OriginKind::Simple(None)
                } else {
                    let roots = match t.ca_file.as_str() {
                        "" => None,
                        p => Some(std::fs::read_to_string(p).map_err(|e| format!("{f}.ca_file {p}: {e}"))?),
                    };
                    let cfg = tls::simple_client_config(roots.as_deref(), alpn(c.protocol)).map_err(|e| format!("{f}: {e}"))?;
                    OriginKind::Simple(Some(cfg))
                }
            }
        };
        Ok(Some(Origin { kind, sni, ctx: ctx.clone() }))
    }

    /// The `tls` label of requests sent with it.
    pub fn mode(&self) -> &'static str {
        match self.kind {
            OriginKind::Mesh(_) => "mtls",
            OriginKind::Simple(_) => "tls",
        }
    }

    /// What a dial to the endpoint `label` (`host:port` as configured) needs.
    pub fn dial(&self, label: &str, protocol: UpstreamProtocol) -> Result<TlsDial<'_>, String> {
        let config = match &self.kind {
            OriginKind::Simple(c) => c.clone().ok_or("TLS origination is not set up in a validation-only config")?,
            OriginKind::Mesh(ids) => {
                let mesh = self.ctx.mesh.as_ref().ok_or("this sidecar has no mesh identity")?;
                let current = mesh.current().ok_or("this sidecar has no certificate yet")?;
                current.client_config(ids, protocol)?
            }
        };
        let name = match &self.sni {
            Some(n) => n.clone(),
            None => {
                let host = label.rsplit_once(':').map_or(label, |(h, _)| h).trim_matches(['[', ']']);
                ServerName::try_from(host.to_string()).map_err(|_| format!("endpoint {label:?}: no server name for TLS; set tls.sni"))?
            }
        };
        Ok(TlsDial { config, name, stats: &self.ctx.stats })
    }
}

/// What one TLS dial needs.
pub struct TlsDial<'a> {
    pub config: Arc<rustls::ClientConfig>,
    pub name: ServerName<'static>,
    pub stats: &'a TlsStats,
}

/// TLS counters, read at scrape time.
#[derive(Default)]
pub struct TlsStats {
    /// Handshakes by (side, result).
    handshakes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Downstream connections by (listener, tls mode of the connection).
    connections: Mutex<BTreeMap<(Arc<str>, &'static str), u64>>,
    /// Credential reloads by result.
    reloads: Mutex<BTreeMap<&'static str, u64>>,
}

impl TlsStats {
    /// A handshake ended: `Ok` or why not (see [`tls::failure_reason`]). `side`: `server`
    /// (a listener) or `client` (a cluster).
    pub fn handshake(&self, side: &'static str, result: Result<(), &'static str>) {
        *self.handshakes.lock().unwrap().entry((side, result.err().unwrap_or("ok"))).or_default() += 1;
    }

    pub fn connection(&self, listener: &Arc<str>, mode: &'static str) {
        *self.connections.lock().unwrap().entry((listener.clone(), mode)).or_default() += 1;
    }

    pub fn reload(&self, result: &'static str) {
        *self.reloads.lock().unwrap().entry(result).or_default() += 1;
    }
}

impl crate::series::Live for TlsContext {
    fn samples(&self, _now_ms: u64, out: &mut Vec<(&'static str, String, f64)>) {
        use crate::series::label_pairs;
        for ((side, result), n) in self.stats.handshakes.lock().unwrap().iter() {
            out.push(("weft_tls_handshakes_total", label_pairs(&[("side", side), ("result", result)]), *n as f64));
        }
        for ((listener, mode), n) in self.stats.connections.lock().unwrap().iter() {
            out.push(("weft_downstream_connections_total", label_pairs(&[("listener", listener), ("tls", mode)]), *n as f64));
        }
        for (result, n) in self.stats.reloads.lock().unwrap().iter() {
            out.push(("weft_tls_credential_reloads_total", label_pairs(&[("result", result)]), *n as f64));
        }
        if let Some(cur) = self.mesh.as_ref().and_then(|m| m.current()) {
            let secs = |t: SystemTime| tls::unix_secs(t) as f64;
            let l = label_pairs(&[("identity", &cur.id.to_string())]);
            out.push(("weft_tls_certificate_expiry_timestamp_seconds", l.clone(), secs(cur.not_after)));
            out.push(("weft_tls_certificate_issued_timestamp_seconds", l, secs(cur.not_before)));
        }
    }
}
