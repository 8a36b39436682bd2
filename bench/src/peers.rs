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
use crate::net::{free_addrs, http_get, wait_ok};
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
    pub fn start(
        self,
        bin: Option<&Path>,
        upstream: &Upstream,
        core: usize,
        tmp: &Path,
    ) -> Result<Running> {
        let Some(bin) = bin else {
            return Ok(Running::direct(self, upstream));
        };
        // A port probed free can still be taken before the peer binds it: try fresh ports.
        let mut attempt = 1;
        loop {
            match self.start_once(bin, upstream, core, tmp) {
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

    fn start_once(
        self,
        bin: &Path,
        upstream: &Upstream,
        core: usize,
        tmp: &Path,
    ) -> Result<Running> {
        let [listen, admin] = free_addrs(2)?[..] else {
            unreachable!("two ports asked")
        };
        let ports = Ports {
            listen,
            admin,
            a: upstream.addrs[0],
            b: upstream.addrs[1],
        };
        let (file, template) = self.template();
        let config = tmp.join(file);
        std::fs::write(&config, ports.fill(template, tmp))?;

        let log_path = tmp.join(format!("{}.log", self.name()));
        let log = File::create(&log_path)?;
        let mut cmd = Command::new("taskset");
        cmd.args(["-c", &core.to_string()])
            .arg(bin)
            .args(self.args(&config, tmp));
        cmd.stdout(log.try_clone()?).stderr(log);
        let mut process = Spawned::start(self.name(), &mut cmd)?;

        let (ready_addr, ready_path) = match self {
            Target::Weft | Target::WeftRelease | Target::Envoy => (ports.admin, "/ready"),
            _ => (ports.listen, "/"),
        };
        let ready = wait_ok(
            ready_addr,
            ready_path,
            &mut process,
            Duration::from_secs(20),
        )
        .and_then(|()| wait_ok(ports.listen, "/", &mut process, Duration::from_secs(5)));
        if let Err(e) = ready {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "{e}\n--- {} (last lines) ---\n{}",
                log_path.display(),
                last_lines(&log, 15)
            );
        }
        Ok(Running {
            target: self,
            listen: ports.listen,
            admin: Some(ports.admin),
            measured_pid: process.pid(),
            process: Some(process),
        })
    }

    fn template(self) -> (&'static str, &'static str) {
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
    /// Admin endpoint (weft, Envoy).
    pub admin: Option<SocketAddr>,
    /// The process whose CPU and memory are reported: the proxy, or the upstream for `direct`.
    pub measured_pid: u32,
    process: Option<Spawned>,
}

impl Running {
    fn direct(target: Target, upstream: &Upstream) -> Self {
        Running {
            target,
            listen: upstream.addrs[0],
            admin: None,
            measured_pid: upstream.process.pid(),
            process: None,
        }
    }

    /// `Err` if the proxy died (e.g. during the load).
    pub fn check_alive(&mut self) -> Result<()> {
        match self.process.as_mut().and_then(Spawned::exited) {
            Some(status) => bail!("{} exited during the load ({status})", self.target.name()),
            None => Ok(()),
        }
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

    #[test]
    fn every_template_is_fully_filled() {
        let addr = SocketAddr::from(([127, 0, 0, 1], 9));
        let ports = Ports {
            listen: addr,
            admin: addr,
            a: addr,
            b: addr,
        };
        for t in &Target::ALL[1..] {
            let out = ports.fill(t.template().1, Path::new("/t"));
            assert!(!out.contains("{{"), "{}: unfilled placeholder", t.name());
        }
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
