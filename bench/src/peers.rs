//! The targets a load generator is pointed at: the upstream itself (`direct`), weft-proxy and
//! its peers. Each peer is one process tree pinned to the proxy core, configured from a template
//! in `bench/peers/` and checked end to end (a request through it answers 200) before use.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::guard::Spawned;
use crate::install;
use crate::mtls::handshake::probe;
use crate::net::{free_addrs, http_get, wait_for, wait_ok};
use crate::upstream::Upstream;

/// Something the load generator can be pointed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The load generator straight to the upstream: the baseline for added latency.
    Direct,
    /// weft-proxy as shipped: the profile-guided build of `scripts/pgo-build.sh` (or the plain
    /// release build, with `--weft-build release`; or `WEFT_PROXY_BIN`).
    Weft,
    /// The plain `cargo build --release` of weft-proxy, beside the shipped build: what the
    /// profile-guided build gains, measured in the same run.
    WeftRelease,
    Envoy,
    Nginx,
    Haproxy,
}

/// Which build of weft-proxy the `weft` target runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WeftBuild {
    /// The profile-guided build (`scripts/pgo-build.sh`): the one to ship.
    Pgo,
    /// `cargo build --release`.
    Release,
}

impl Target {
    /// All targets, in report order.
    pub const ALL: [Target; 6] = [
        Target::Direct,
        Target::Weft,
        Target::WeftRelease,
        Target::Envoy,
        Target::Nginx,
        Target::Haproxy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Weft => "weft",
            Target::WeftRelease => "weft_release",
            Target::Envoy => "envoy",
            Target::Nginx => "nginx",
            Target::Haproxy => "haproxy",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .with_context(|| {
                format!("unknown target {name:?} (known: direct, weft, weft_release, envoy, nginx, haproxy)")
            })
    }

    /// Finds or installs the peer's binary; `None` for `direct`, which has no proxy. `weft` is
    /// the build `weft_build` names, made from this workspace, unless `WEFT_PROXY_BIN` names
    /// another build to measure (e.g. an older commit's, for an A/B against the same peers).
    pub fn prepare(self, weft_build: WeftBuild) -> Result<Option<PathBuf>> {
        match self {
            Target::Direct => Ok(None),
            Target::Weft => match std::env::var_os("WEFT_PROXY_BIN") {
                Some(p) if Path::new(&p).is_file() => Ok(Some(PathBuf::from(p))),
                Some(p) => bail!("WEFT_PROXY_BIN={}: no such file", Path::new(&p).display()),
                None => match weft_build {
                    WeftBuild::Pgo => crate::workspace::pgo_weft_proxy().map(Some),
                    WeftBuild::Release => crate::workspace::release_bin("weft-proxy").map(Some),
                },
            },
            Target::WeftRelease => crate::workspace::release_bin("weft-proxy").map(Some),
            Target::Envoy => install::ensure_envoy().map(Some),
            Target::Nginx => install::ensure_apt("nginx", "nginx-light").map(Some),
            Target::Haproxy => install::ensure_apt("haproxy", "haproxy").map(Some),
        }
    }

    /// The peer's version string, for the report (Envoy's starts with its path: dropped).
    pub fn version(self, bin: &Path) -> Option<String> {
        let args: &[&str] = match self {
            Target::Direct => return None,
            Target::Weft | Target::WeftRelease | Target::Envoy | Target::Haproxy => &["--version"],
            Target::Nginx => &["-v"],
        };
        let line = install::version_line(bin, args)?;
        Some(
            line.split_once(" version: ")
                .map_or(line.clone(), |(_, v)| v.to_string()),
        )
    }

    /// Starts the target on `core` in front of `upstream` and waits until it proxies a request.
    ///
    /// With `mtls` (the mTLS scenario; needs the certificates of `mtls::pki::generate` in
    /// `tmp`), weft and Envoy start as a pair of sidecars on `core`: B (inbound, requiring
    /// mutual TLS) in front of `upstream`, then A (outbound, plaintext listener) originating
    /// mTLS to B; both are measured. nginx and HAProxy start as one process terminating TLS in
    /// front of `upstream`. Ready when B (or the terminator) answers the handshake generator's
    /// exchange and a request through the whole path answers 200.
    pub fn start(
        self,
        mtls: bool,
        bin: Option<&Path>,
        upstream: &Upstream,
        core: usize,
        tmp: &Path,
    ) -> Result<Running> {
        let Some(bin) = bin else {
            if mtls {
                bail!("{} has no mTLS scenario", self.name());
            }
            return Ok(Running::direct(self, upstream));
        };
        let site = Site {
            bin,
            upstream,
            core,
            tmp,
        };
        self.on_free_ports(|| {
            if mtls {
                self.start_mtls_once(&site)
            } else {
                self.start_once(&site)
            }
        })
    }

    /// Runs `start`, again with fresh ports (at most three times) when a port probed free was
    /// taken before the peer bound it.
    fn on_free_ports(self, mut start: impl FnMut() -> Result<Running>) -> Result<Running> {
        let mut attempt = 1;
        loop {
            match start() {
                Err(e)
                    if attempt < 3
                        && format!("{e:#}")
                            .to_lowercase()
                            .contains("address already in use") =>
                {
                    eprintln!(
                        "{}: port taken during start-up, retrying with other ports",
                        self.name()
                    );
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn start_once(self, site: &Site) -> Result<Running> {
        let Site {
            bin,
            upstream,
            core,
            tmp,
        } = *site;
        let [listen, admin] = free_addrs(2)?[..] else {
            unreachable!("two ports asked")
        };
        let ports = Ports {
            listen,
            admin,
            a: upstream.addrs[0],
            b: upstream.addrs[1],
        };
        let mut proxy = self.launch(bin, core, tmp, self.name(), self.template(), &ports)?;
        proxy.ready(|p| wait_ok(listen, "/", p, READY_WITHIN))?;
        Ok(Running {
            target: self,
            listen,
            scheme: "http",
            admin: Some(admin),
            measured_pids: vec![proxy.process.pid()],
            tls_server: None,
            processes: vec![proxy.process],
        })
    }

    fn start_mtls_once(self, site: &Site) -> Result<Running> {
        let Site {
            bin,
            upstream,
            core,
            tmp,
        } = *site;
        let tls_ready = |addr| move |p: &mut Spawned| wait_for(p, READY_WITHIN, || probe(addr, tmp));
        let [listen, admin, b_listen, b_admin] = free_addrs(4)?[..] else {
            unreachable!("four ports asked")
        };
        let ports = |listen, admin, to| Ports {
            listen,
            admin,
            a: to,
            b: to,
        };
        let to_upstream = ports(b_listen, b_admin, upstream.addrs[0]);
        let (roles, templates) = match self.mtls_templates()? {
            MtlsTemplates::Terminator(template) => {
                let role = format!("{}-tls", self.name());
                let to_upstream = ports(listen, admin, upstream.addrs[0]);
                let mut proxy = self.launch(bin, core, tmp, &role, template, &to_upstream)?;
                proxy.ready(tls_ready(listen))?;
                let pid = proxy.process.pid();
                return Ok(Running {
                    target: self,
                    listen,
                    scheme: "https",
                    admin: None,
                    measured_pids: vec![pid],
                    tls_server: Some((listen, pid)),
                    processes: vec![proxy.process],
                });
            }
            MtlsTemplates::Pair { inbound, outbound } => (
                [
                    format!("{}-inbound", self.name()),
                    format!("{}-outbound", self.name()),
                ],
                [inbound, outbound],
            ),
        };
        let mut b = self.launch(bin, core, tmp, &roles[0], templates[0], &to_upstream)?;
        b.ready(tls_ready(b_listen))?;
        let to_b = ports(listen, admin, b_listen);
        let mut a = self.launch(bin, core, tmp, &roles[1], templates[1], &to_b)?;
        a.ready(|p| wait_ok(listen, "/", p, READY_WITHIN))?;
        let (a_pid, b_pid) = (a.process.pid(), b.process.pid());
        Ok(Running {
            target: self,
            listen,
            scheme: "http",
            admin: None,
            measured_pids: vec![a_pid, b_pid],
            tls_server: Some((b_listen, b_pid)),
            processes: vec![a.process, b.process],
        })
    }

    /// Writes `template` filled with `ports` and starts the peer pinned to `core`, logging to
    /// `tmp/ROLE.log`; for weft and Envoy, waits until the admin endpoint says ready.
    fn launch(
        self,
        bin: &Path,
        core: usize,
        tmp: &Path,
        role: &str,
        (file, template): (&str, &str),
        ports: &Ports,
    ) -> Result<Launched> {
        let config = tmp.join(file);
        std::fs::write(&config, ports.fill(template, tmp))?;
        let log = tmp.join(format!("{role}.log"));
        let out = File::create(&log)?;
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", &core.to_string()])
            .arg(bin)
            .args(self.args(&config, tmp));
        cmd.stdout(out.try_clone()?).stderr(out);
        let mut launched = Launched {
            process: Spawned::start(role, &mut cmd)?,
            log,
        };
        if matches!(self, Target::Weft | Target::WeftRelease | Target::Envoy) {
            let admin = ports.admin;
            launched.ready(|p| wait_ok(admin, "/ready", p, READY_WITHIN))?;
        }
        Ok(launched)
    }

    /// The mTLS scenario's configuration templates (`bench/peers/mtls/`).
    fn mtls_templates(self) -> Result<MtlsTemplates> {
        Ok(match self {
            Target::Direct => bail!("direct has no mTLS scenario"),
            Target::Weft | Target::WeftRelease => MtlsTemplates::Pair {
                inbound: (
                    "mtls-weft-inbound.yaml",
                    include_str!("../peers/mtls/weft-inbound.yaml"),
                ),
                outbound: (
                    "mtls-weft-outbound.yaml",
                    include_str!("../peers/mtls/weft-outbound.yaml"),
                ),
            },
            Target::Envoy => MtlsTemplates::Pair {
                inbound: (
                    "mtls-envoy-inbound.yaml",
                    include_str!("../peers/mtls/envoy-inbound.yaml"),
                ),
                outbound: (
                    "mtls-envoy-outbound.yaml",
                    include_str!("../peers/mtls/envoy-outbound.yaml"),
                ),
            },
            Target::Nginx => MtlsTemplates::Terminator((
                "mtls-nginx.conf",
                include_str!("../peers/mtls/nginx-tls.conf"),
            )),
            Target::Haproxy => MtlsTemplates::Terminator((
                "mtls-haproxy.cfg",
                include_str!("../peers/mtls/haproxy-tls.cfg"),
            )),
        })
    }

    fn template(self) -> Template {
        match self {
            Target::Direct => unreachable!("direct has no configuration"),
            Target::Weft | Target::WeftRelease => ("weft.yaml", include_str!("../peers/weft.yaml")),
            Target::Envoy => ("envoy.yaml", include_str!("../peers/envoy.yaml")),
            Target::Nginx => ("nginx.conf", include_str!("../peers/nginx.conf")),
            Target::Haproxy => ("haproxy.cfg", include_str!("../peers/haproxy.cfg")),
        }
    }

    /// Command-line arguments: one worker, foreground, no hot-restart shared memory.
    fn args(self, config: &Path, tmp: &Path) -> Vec<String> {
        let config = config.display().to_string();
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        match self {
            Target::Direct => Vec::new(),
            Target::Weft | Target::WeftRelease => owned(&["--config", &config, "--workers", "1"]),
            Target::Envoy => owned(&[
                "-c",
                &config,
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "-l",
                "warn",
            ]),
            Target::Nginx => {
                let tmp = tmp.display().to_string();
                owned(&[
                    "-p",
                    &tmp,
                    "-e",
                    &format!("{tmp}/nginx-error.log"),
                    "-c",
                    &config,
                ])
            }
            Target::Haproxy => owned(&["-db", "-f", &config]),
        }
    }
}

/// Where a target starts: its binary, the upstream it fronts, its core, the scratch directory.
#[derive(Clone, Copy)]
struct Site<'a> {
    bin: &'a Path,
    upstream: &'a Upstream,
    core: usize,
    tmp: &'a Path,
}

/// How long a started peer may take to become ready.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// A configuration file's name and its template.
type Template = (&'static str, &'static str);

/// What a target runs in the mTLS scenario.
enum MtlsTemplates {
    /// Two sidecars with mutual TLS between them (weft, Envoy).
    Pair {
        inbound: Template,
        outbound: Template,
    },
    /// One process terminating TLS from the load generator (nginx, HAProxy).
    Terminator(Template),
}

/// One started peer process and its log.
struct Launched {
    process: Spawned,
    log: PathBuf,
}

impl Launched {
    /// Runs the readiness check `check`; its error carries the last lines of the peer's log.
    fn ready(&mut self, check: impl FnOnce(&mut Spawned) -> Result<()>) -> Result<()> {
        check(&mut self.process).map_err(|e| {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            anyhow::anyhow!(
                "{e:#}\n--- {} (last lines) ---\n{}",
                self.log.display(),
                last_lines(&log, 15)
            )
        })
    }
}

/// The addresses a configuration template refers to.
struct Ports {
    listen: SocketAddr,
    admin: SocketAddr,
    a: SocketAddr,
    b: SocketAddr,
}

impl Ports {
    /// Replaces `{{NAME}}` with `ip:port`, `{{NAME_PORT}}` with the port and `{{TMP}}` with the
    /// temp dir.
    fn fill(&self, template: &str, tmp: &Path) -> String {
        let named = [
            ("LISTEN", self.listen),
            ("ADMIN", self.admin),
            ("UPSTREAM_A", self.a),
            ("UPSTREAM_B", self.b),
        ];
        let mut out = template.replace("{{TMP}}", &tmp.display().to_string());
        for (name, addr) in named {
            out = out
                .replace(&format!("{{{{{name}_PORT}}}}"), &addr.port().to_string())
                .replace(&format!("{{{{{name}}}}}"), &addr.to_string());
        }
        out
    }
}

/// A started target, stopped on drop.
pub struct Running {
    pub target: Target,
    /// Where the load generator sends requests.
    pub listen: SocketAddr,
    /// `http`, or `https` for a TLS terminator of the mTLS scenario.
    pub scheme: &'static str,
    /// Admin endpoint (weft, Envoy; plaintext scenario).
    pub admin: Option<SocketAddr>,
    /// The processes whose CPU and memory are reported: the proxy (both sidecars of an mTLS
    /// pair), or the upstream for `direct`.
    pub measured_pids: Vec<u32>,
    /// mTLS scenario: the TLS server (sidecar B, or the terminator) the handshake generator
    /// connects to, and its process.
    pub tls_server: Option<(SocketAddr, u32)>,
    processes: Vec<Spawned>,
}

impl Running {
    fn direct(target: Target, upstream: &Upstream) -> Self {
        Running {
            target,
            listen: upstream.addrs[0],
            scheme: "http",
            admin: None,
            measured_pids: vec![upstream.process.pid()],
            tls_server: None,
            processes: Vec::new(),
        }
    }

    /// The URL the load generator requests.
    pub fn url(&self) -> String {
        format!("{}://{}/", self.scheme, self.listen)
    }

    /// `Err` if a proxy process died (e.g. during the load).
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.processes {
            if let Some(status) = p.exited() {
                bail!("{} exited during the load ({status})", p.name);
            }
        }
        Ok(())
    }

    /// Share of requests routed to variant `a`, from the proxy's own per-variant metrics:
    /// evidence that the experiment (and its metrics) were really on. `None` for plain proxies.
    pub fn variant_a_share(&self) -> Option<Result<f64>> {
        let admin = self.admin?;
        let (path, parse): (&str, CountParser) = match self.target {
            Target::Envoy => ("/stats?filter=upstream_rq_total", envoy_variant_counts),
            Target::Weft | Target::WeftRelease => ("/metrics", weft_variant_counts),
            _ => return None,
        };
        Some(http_get(admin, path).and_then(|(_, body)| {
            let (a, b) =
                parse(&body).with_context(|| format!("no per-variant counters at {path}"))?;
            Ok(a / (a + b))
        }))
    }
}

/// Reads (requests to variant a, requests to variant b) from an admin page.
type CountParser = fn(&str) -> Option<(f64, f64)>;

/// `cluster.variant_a.upstream_rq_total: N` and the same for `variant_b`.
fn envoy_variant_counts(stats: &str) -> Option<(f64, f64)> {
    let count = |cluster: &str| {
        let key = format!("cluster.{cluster}.upstream_rq_total:");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&key)?.trim().parse().ok())
    };
    Some((count("variant_a")?, count("variant_b")?))
}

/// Sum of `weft_requests_total` series labelled `variant="a"` / `variant="b"` (all status classes).
fn weft_variant_counts(metrics: &str) -> Option<(f64, f64)> {
    let count = |variant: &str| {
        let label = format!("variant=\"{variant}\"");
        let values = metrics
            .lines()
            .filter(|l| l.starts_with("weft_requests_total{") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        let (sum, n) = values.fold((0.0, 0), |(s, n), v| (s + v, n + 1));
        (n > 0).then_some(sum)
    };
    Some((count("a")?, count("b")?))
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_addresses_and_ports() {
        let addr = |p| SocketAddr::from(([127, 0, 0, 1], p));
        let ports = Ports {
            listen: addr(1),
            admin: addr(2),
            a: addr(3),
            b: addr(4),
        };
        let out = ports.fill(
            "{{LISTEN}} {{ADMIN_PORT}} {{UPSTREAM_A}} {{UPSTREAM_B_PORT}} {{TMP}}/x",
            Path::new("/t"),
        );
        assert_eq!(out, "127.0.0.1:1 2 127.0.0.1:3 4 /t/x");
    }

    /// Every address the same.
    fn any_ports() -> Ports {
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        Ports {
            listen: addr,
            admin: addr,
            a: addr,
            b: addr,
        }
    }

    #[test]
    fn every_template_is_fully_filled() {
        let ports = any_ports();
        for t in &Target::ALL[1..] {
            let out = ports.fill(t.template().1, Path::new("/t"));
            assert!(!out.contains("{{"), "{}: unfilled placeholder", t.name());
        }
    }

    /// The mTLS templates are filled too, and name only certificate files the bench writes.
    #[test]
    fn every_mtls_template_is_filled_and_names_the_bench_certificates() {
        let ports = any_ports();
        for t in &Target::ALL[1..] {
            let templates = match t.mtls_templates().unwrap() {
                MtlsTemplates::Pair { inbound, outbound } => vec![inbound, outbound],
                MtlsTemplates::Terminator(one) => vec![one],
            };
            for (file, template) in templates {
                let out = ports.fill(template, Path::new("/t"));
                assert!(!out.contains("{{"), "{file}: unfilled placeholder");
                let named = out.split("/t/").skip(1).filter_map(|rest| {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '.')
                        .collect();
                    name.ends_with(".pem").then_some(name)
                });
                let named: Vec<String> = named.collect();
                assert!(!named.is_empty(), "{file}: no certificate");
                for pem in named {
                    assert!(crate::mtls::pki::FILES.contains(&pem.as_str()), "{file}: {pem}");
                }
            }
        }
        assert!(Target::Direct.mtls_templates().is_err());
    }

    #[test]
    fn reads_variant_counters() {
        let envoy =
            "cluster.variant_a.upstream_rq_total: 60\ncluster.variant_b.upstream_rq_total: 40\n";
        assert_eq!(envoy_variant_counts(envoy), Some((60.0, 40.0)));
        let weft = "# TYPE weft_requests_total counter\nweft_requests_total{variant=\"a\",code=\"200\"} 5\n\
                    weft_requests_total{variant=\"b\",code=\"200\"} 7\nweft_requests_total{variant=\"a\",code=\"503\"} 1\n";
        assert_eq!(weft_variant_counts(weft), Some((6.0, 7.0)));
    }
}
