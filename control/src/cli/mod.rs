//! `weftctl`, the command-line client of the control plane's REST API
//! (`docs/control-api.md`, section "weftctl"). The binary (`src/bin/weftctl.rs`) only calls
//! [`main`].
//!
//! - `client`: HTTP/1.1 on hyper, trying each `--server` in turn, retrying `503` (elections).
//! - `apply`: multi-document YAML → parse all, dry-run all, then write what changed.
//! - `diff`: the line diff `apply --dry-run` prints.
//! - `output`: tables, JSON and YAML.
//! - `node`: `node list|describe` (the inventory beside the agents' reports).
//!
//! Exit codes: 0 success, 1 the server refused or could not be reached, 2 bad usage or input
//! that never reached a server (flags, YAML, weights syntax).

pub mod apply;
pub mod client;
pub mod describe;
pub mod diff;
pub mod output;
pub mod autoscale;
pub mod experiment;
pub mod node;
pub mod schedule;
pub mod stat;
pub mod training;

use std::io::{Read, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use http::Method;
use serde_json::{Value, json};

use crate::resources::Kind;
use client::{Client, ClientError, Response, Server};
use output::Format;

/// Where `weftctl` looks when neither `--server` nor `WEFT_SERVER` says.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7700";

#[derive(Debug, Parser)]
#[command(name = "weftctl", version, about = "Command-line client of the weft control plane")]
pub struct Args {
    /// Control node(s) to talk to, tried in order until one answers (env WEFT_SERVER).
    #[arg(long, global = true, value_name = "URL[,URL...]")]
    pub server: Option<String>,
    /// Bearer token, when the cluster runs with --tokens (env WEFT_TOKEN).
    #[arg(long, global = true, value_name = "T")]
    pub token: Option<String>,
    /// Roots (PEM) to check `https://` control nodes against: the mesh root (`weftctl identity
    /// ca` prints it) when the nodes run --tls-from-ca. With it, a bare HOST:PORT is https
    /// (env WEFT_CA).
    #[arg(long, global = true, value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for nodes that run --tls-client-ca (env WEFT_CERT); needs --key.
    #[arg(long, global = true, value_name = "FILE", requires = "key")]
    pub cert: Option<std::path::PathBuf>,
    /// The --cert's private key (PEM; env WEFT_KEY).
    #[arg(long, global = true, value_name = "FILE", requires = "cert")]
    pub key: Option<std::path::PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update resources from a multi-document YAML file of {kind, name, spec}.
    Apply {
        /// The file, or `-` for stdin.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: String,
        /// Show what would change, as a diff per document, and write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Write documents whose references (a route's cluster, a variant's cluster) resolve
        /// neither on the server nor in this file, with a warning. Without it they are refused:
        /// sidecars cannot serve them until the target exists.
        #[arg(long)]
        allow_dangling: bool,
    },
    /// List the resources of a kind, or show one; without a kind, list the kinds.
    Get { kind: Option<String>, name: Option<String> },
    /// One resource whole: spec, the status the control plane derived from it, history, and
    /// which sidecars run its revision (ACKed), NACKed it or are behind.
    Describe { kind: String, name: String },
    /// Delete a resource.
    Delete { kind: String, name: String },
    /// The revisions of a resource, oldest first.
    History { kind: String, name: String },
    /// Restore a resource to the spec it had at a revision (a new write).
    Rollback {
        kind: String,
        name: String,
        /// The revision to restore (see `history`).
        #[arg(long, value_name = "REV")]
        to: u64,
    },
    /// Experiment operations.
    Experiment {
        #[command(subcommand)]
        command: ExperimentCommand,
    },
    /// Control-plane members (default: list them).
    Members {
        #[command(subcommand)]
        command: Option<MembersCommand>,
    },
    /// GPU placement of workloads (inference replicas, training gangs, pods).
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
    },
    /// GPU nodes: the inventory beside what each node's agent reports (GPUs, replicas,
    /// weight holders).
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// The autoscaler: what it sees and decides per variant, and spot preemption notices.
    Autoscale {
        #[command(subcommand)]
        command: AutoscaleCommand,
    },
    /// Golden metrics per service, experiment and variant over a recent window: success rate,
    /// requests/s, p50/p95/p99 latency.
    Stat {
        /// Seconds of recent traffic (10–300).
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(10..=300))]
        window: u64,
    },
    /// Training jobs: their shard maps, and rescaling.
    Training {
        #[command(subcommand)]
        command: TrainingCommand,
    },
    /// Workload identity: the mesh CA's root, and join tokens sidecars get certificates with.
    Identity {
        #[command(subcommand)]
        command: IdentityCommand,
    },
    /// Sidecars connected to any control node, with the config versions they ACKed.
    ProxyStatus,
    /// The state of the node that answers.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum ExperimentCommand {
    /// Per variant: requests, error rate, p50/p95/p99 with 95% intervals; the SRM check; the
    /// rollout's phase, verdict, confidence and why.
    Status { name: String },
    /// Give the candidate all traffic now (ends the rollout).
    Promote { name: String },
    /// Send the candidate back to 0% now (ends the rollout).
    Rollback { name: String },
    /// Hold the rollout at its current weight (judging stops).
    Pause { name: String },
    /// Continue a paused rollout.
    Resume { name: String },
    /// Set variant weights in one write: `set-weights NAME a=90 b=10`.
    SetWeights {
        name: String,
        #[arg(required = true, value_name = "VARIANT=WEIGHT")]
        weights: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Every node: the GPU source, GPUs, ready/total replicas, holders and how recent its
    /// agent's report is (`no agent`, `stale 2m0s`).
    List,
    /// One node: its inventory entry, GPUs, replicas with their state, weight holders and the
    /// agent's warnings.
    Describe { name: String },
}

#[derive(Debug, Subcommand)]
pub enum AutoscaleCommand {
    /// Per autoscaler: demand, forecast, ready replicas, the decision and why.
    Status,
    /// A spot preemption notice: critical replicas are replaced on on-demand at once.
    /// Give `--node` (the scheduler's placements on it), or `--autoscaler` and `--replicas`.
    Preempt {
        #[arg(long, conflicts_with_all = ["autoscaler", "replicas"])]
        node: Option<String>,
        #[arg(long, requires = "replicas")]
        autoscaler: Option<String>,
        #[arg(long, requires = "autoscaler")]
        replicas: Option<u32>,
        /// Seconds until the capacity goes.
        #[arg(long, default_value_t = 120.0)]
        notice_s: f64,
    },
}

#[derive(Debug, Subcommand)]
pub enum IdentityCommand {
    /// Print the mesh CA's root certificate (PEM): what sidecars and clients trust.
    Ca,
    /// Join tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Revoke an identity now: its join tokens are revoked (no new certificate) and every
    /// sidecar refuses its certificates issued so far (a `revocations` resource).
    Revoke {
        /// `ns/NAMESPACE/sa/ACCOUNT`, `service/NAME`, or a whole spiffe:// ID.
        #[arg(long)]
        identity: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// A join token for one identity (printed once: put it in the sidecar's
    /// identity.token_file). Needs an admin token.
    Create {
        /// `ns/NAMESPACE/sa/ACCOUNT`, `service/NAME`, or a whole spiffe:// ID.
        #[arg(long)]
        identity: String,
        /// How long the token may be used ("720h"; "0" = until revoked). Renewals use it too,
        /// so a sidecar keeps its identity while the token lives.
        #[arg(long)]
        ttl: Option<String>,
        #[arg(long, default_value = "")]
        description: String,
    },
    /// The tokens, without their secrets.
    List,
    /// Revoke a token: certificates are no longer issued or renewed with it.
    Revoke { id: String },
}

#[derive(Debug, Subcommand)]
pub enum TrainingCommand {
    /// Ranks, shards per rank, batch share, layout and the map version of a job.
    Status { job: String },
    /// Set a job's worker count; the control plane computes the next shard map (moving as few
    /// shards as possible, keeping the global batch).
    Scale {
        job: String,
        #[arg(long)]
        workers: u32,
    },
    /// Ask every rank to checkpoint at a step the control plane picks (a few steps past the
    /// furthest rank); `training status` shows when it is complete.
    Checkpoint {
        job: String,
        /// Steps past the furthest rank.
        #[arg(long, default_value_t = 5)]
        after_steps: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Where the workloads would go, and why the others cannot be placed; writes nothing.
    Plan {
        /// Workloads YAML (`workloads: [...]`, a list, or one per document), or `-` for stdin.
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: String,
        /// Let higher-priority workloads evict strictly lower-priority placements.
        #[arg(long)]
        preempt: bool,
    },
    /// Plan on the stored inventory and commit the placements (pushed to node agents over xDS).
    Apply {
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: String,
        #[arg(long)]
        preempt: bool,
    },
    /// Every placement with its node(s), variant, base model and the replica's state, reason
    /// and endpoint as its node's agent reports them (`pending` until one does).
    Status,
}

#[derive(Debug, Subcommand)]
pub enum MembersCommand {
    /// List the members.
    List,
    /// Add a node (as a voter unless --learner).
    Add {
        id: u64,
        /// host:port of its API.
        addr: String,
        /// host:port of its xDS listener.
        xds_addr: Option<String>,
        /// Replicate to it without giving it a vote.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a node.
    Remove { id: u64 },
}

/// Why a command failed: bad input (exit 2) or a request the server refused or that reached
/// no server (exit 1). The message may span lines; each is printed as `error: ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliError {
    Usage(String),
    Request(String),
}

impl CliError {
    pub fn request(e: ClientError) -> CliError {
        CliError::Request(e.to_string())
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::Request(_) => 1,
        }
    }

    pub fn message(&self) -> &str {
        match self {
            CliError::Usage(m) | CliError::Request(m) => m,
        }
    }
}

/// The server's error of a non-2xx answer, as printed: `message (field: f)`.
pub(crate) fn api_error(r: &Response) -> String {
    r.error_line()
}

/// The body of a 2xx answer, or the server's error.
pub(crate) fn ok_or_api_error(r: Response) -> Result<Value, CliError> {
    if r.status.is_success() { Ok(r.body) } else { Err(CliError::Request(api_error(&r))) }
}

/// Writes to stdout; a closed pipe (`weftctl get services | head -1`) is not an error worth
/// a panic, so write errors are ignored.
pub(crate) fn out(s: impl AsRef<str>) {
    if cfg!(test) {
        // Through the macro, which the test harness captures.
        print!("{}", s.as_ref());
        return;
    }
    let _ = std::io::stdout().lock().write_all(s.as_ref().as_bytes());
}

/// One line to stderr, likewise ignoring a closed stream.
pub(crate) fn err_line(s: impl AsRef<str>) {
    if cfg!(test) {
        eprintln!("{}", s.as_ref());
        return;
    }
    let _ = writeln!(std::io::stderr().lock(), "{}", s.as_ref());
}

/// A kind from the command line, in any spelling `Kind::parse` accepts.
pub fn parse_kind(s: &str) -> Result<Kind, CliError> {
    Kind::parse(s).ok_or_else(|| {
        let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
        CliError::Usage(format!("unknown kind {s:?}; expected one of {}", known.join(", ")))
    })
}

/// A resource name from the command line, checked like the server checks it, so a name that
/// could not even be put in a URL is a usage error rather than a failed request.
pub fn parse_name(s: &str) -> Result<&str, CliError> {
    crate::resources::check_name(s).map(|()| s).map_err(|e| CliError::Usage(e.to_string()))
}

/// `a=90 b=10` → `{"a": 90, "b": 10}`.
pub fn parse_weights(args: &[String]) -> Result<serde_json::Map<String, Value>, CliError> {
    let mut weights = serde_json::Map::new();
    for a in args {
        let bad = || CliError::Usage(format!("{a:?}: expected VARIANT=WEIGHT, e.g. a=90 (weights are whole numbers)"));
        let (name, w) = a.split_once('=').ok_or_else(bad)?;
        let (name, w) = (name.trim(), w.trim());
        if name.is_empty() {
            return Err(bad());
        }
        let w: u32 = w.parse().map_err(|_| bad())?;
        if weights.insert(name.to_string(), json!(w)).is_some() {
            return Err(CliError::Usage(format!("variant {name:?} is given twice")));
        }
    }
    Ok(weights)
}

/// The client for the global flags and environment.
fn client(args: &Args) -> Result<Client, CliError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let servers = args.server.clone().or_else(|| env("WEFT_SERVER")).unwrap_or_else(|| DEFAULT_SERVER.to_string());
    let path = |flag: &Option<std::path::PathBuf>, var: &str| flag.clone().or_else(|| env(var).map(Into::into));
    let ca = path(&args.ca, "WEFT_CA");
    let servers = Server::parse_list(&servers, ca.is_some()).map_err(|e| CliError::Usage(format!("--server {e}")))?;
    let token = args.token.clone().or_else(|| env("WEFT_TOKEN"));
    let Some(ca) = ca else {
        if let Some(s) = servers.iter().find(|s| s.tls) {
            return Err(CliError::Usage(format!("--server https://{}: give --ca FILE, the roots to check the node against (the mesh root)", s.authority)));
        }
        return Ok(Client::new(servers, token));
    };
    let client = Client::new(servers, token);
    let dialer = crate::tls::dial::Dialer::from_files(&ca, path(&args.cert, "WEFT_CERT").zip(path(&args.key, "WEFT_KEY")))
        .map_err(CliError::Usage)?;
    Ok(client.with_tls(dialer))
}

fn read_input(file: &str) -> Result<String, CliError> {
    let mut text = String::new();
    let r = if file == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::File::open(file).and_then(|mut f| f.read_to_string(&mut text)).map(|_| ())
    };
    r.map_err(|e| CliError::Usage(format!("{}: {e}", if file == "-" { "stdin" } else { file })))?;
    Ok(text)
}

/// GET/POST/... and the 2xx body, or the server's error.
async fn call(c: &mut Client, method: Method, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
    let r = c.request(method, path, body, None).await.map_err(CliError::request)?;
    ok_or_api_error(r)
}

/// GET `path`'s body, or `Value::Null` when the resource does not exist (404). An unknown
/// kind (a server older than this weftctl) is an error, not an absent resource.
async fn get_optional(c: &mut Client, path: &str) -> Result<Value, CliError> {
    let r = c.request(Method::GET, path, None, None).await.map_err(CliError::request)?;
    if r.status == http::StatusCode::NOT_FOUND && r.body["field"] != "kind" {
        return Ok(Value::Null);
    }
    ok_or_api_error(r)
}

/// Prints `value` as JSON/YAML, or the table `table` renders from it.
fn show(format: Format, value: &Value, table: impl FnOnce(&Value) -> String) {
    match output::structured(format, value) {
        Some(s) => out(s),
        None => out(table(value)),
    }
}

fn warnings(object: &str, body: &Value) {
    for w in body["warnings"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        err_line(format!("warning: {object}: {w}"));
    }
}

/// `experiment promote|rollback|pause|resume NAME`.
async fn rollout_command(c: &mut Client, format: Format, action: &str, name: &str) -> Result<(), CliError> {
    let name = parse_name(name)?;
    let body = call(c, Method::POST, &format!("/v1/rollout/{name}/{action}"), None).await?;
    show(format, &body, experiment::command_line);
    Ok(())
}

/// Runs one parsed command line.
pub async fn run(args: Args) -> Result<(), CliError> {
    let format = args.output;
    // Input is checked before any connection: a bad file never reaches a server.
    let docs = match &args.command {
        Command::Apply { file, .. } => Some(apply::parse_docs(&read_input(file)?).map_err(CliError::Usage)?),
        _ => None,
    };
    let workloads = match &args.command {
        Command::Schedule { command: ScheduleCommand::Plan { file, preempt } | ScheduleCommand::Apply { file, preempt } } => {
            let text = read_input(file)?;
            Some(schedule::parse_request(&text, *preempt).map_err(|e| CliError::Usage(format!("{file}: {e}")))?)
        }
        _ => None,
    };
    let mut c = client(&args)?;
    match args.command {
        Command::Apply { dry_run, allow_dangling, .. } => {
            let dangling = if allow_dangling { apply::Dangling::Allow } else { apply::Dangling::Refuse };
            apply::run(&mut c, docs.unwrap_or_default(), dry_run, dangling, format).await
        }
        Command::Get { kind: None, .. } => {
            let mut counts = serde_json::Map::new();
            for k in Kind::ALL {
                let list = call(&mut c, Method::GET, &format!("/v1/{k}"), None).await?;
                counts.insert(k.as_str().into(), json!(list["items"].as_array().map_or(0, Vec::len)));
            }
            show(format, &Value::Object(counts), output::kinds_table);
            Ok(())
        }
        Command::Describe { kind, name } => {
            let (kind, name) = (parse_kind(&kind)?, parse_name(&name)?);
            let d = describe::gather(&mut c, kind, name).await?;
            show(format, &d, |d| describe::render(kind, d));
            Ok(())
        }
        Command::Get { kind: Some(kind), name } => {
            let kind = parse_kind(&kind)?;
            match name {
                Some(name) => {
                    let name = parse_name(&name)?;
                    let item = call(&mut c, Method::GET, &format!("/v1/{kind}/{name}"), None).await?;
                    show(format, &item, |v| output::items_table(kind, std::slice::from_ref(v)));
                }
                None => {
                    let list = call(&mut c, Method::GET, &format!("/v1/{kind}"), None).await?;
                    let items = list["items"].as_array().cloned().unwrap_or_default();
                    show(format, &Value::Array(items.clone()), |_| output::items_table(kind, &items));
                }
            }
            Ok(())
        }
        Command::Delete { kind, name } => {
            let (kind, name) = (parse_kind(&kind)?, parse_name(&name)?);
            let body = call(&mut c, Method::DELETE, &format!("/v1/{kind}/{name}"), None).await?;
            show(format, &body, |b| {
                format!("{} deleted (revision {})\n", output::object(kind, name), output::cell(&b["revision"]))
            });
            Ok(())
        }
        Command::History { kind, name } => {
            let (kind, name) = (parse_kind(&kind)?, parse_name(&name)?);
            let body = call(&mut c, Method::GET, &format!("/v1/{kind}/{name}/history"), None).await?;
            let items = body["items"].as_array().cloned().unwrap_or_default();
            show(format, &Value::Array(items.clone()), |_| output::history_table(kind, &items));
            Ok(())
        }
        Command::Rollback { kind, name, to } => {
            let (kind, name) = (parse_kind(&kind)?, parse_name(&name)?);
            let path = format!("/v1/{kind}/{name}/rollback");
            let body = call(&mut c, Method::POST, &path, Some(&json!({ "revision": to }))).await?;
            show(format, &body, |b| {
                format!(
                    "{} rolled back to revision {to} (revision {})\n",
                    output::object(kind, name),
                    output::cell(&b["revision"])
                )
            });
            Ok(())
        }
        Command::Experiment { command: ExperimentCommand::Status { name } } => {
            let name = parse_name(&name)?;
            let body = call(&mut c, Method::GET, &format!("/v1/rollout/{name}"), None).await?;
            show(format, &body, experiment::status_table);
            Ok(())
        }
        Command::Experiment { command: ExperimentCommand::Promote { name } } => rollout_command(&mut c, format, "promote", &name).await,
        Command::Experiment { command: ExperimentCommand::Rollback { name } } => rollout_command(&mut c, format, "rollback", &name).await,
        Command::Experiment { command: ExperimentCommand::Pause { name } } => rollout_command(&mut c, format, "pause", &name).await,
        Command::Experiment { command: ExperimentCommand::Resume { name } } => rollout_command(&mut c, format, "resume", &name).await,
        Command::Experiment { command: ExperimentCommand::SetWeights { name, weights } } => {
            let (name, weights) = (parse_name(&name)?, parse_weights(&weights)?);
            let path = format!("/v1/experiments/{name}/weights");
            let body = call(&mut c, Method::POST, &path, Some(&json!({ "weights": weights }))).await?;
            let object = output::object(Kind::Experiments, name);
            warnings(&object, &body);
            show(format, &body, |b| {
                let what = if b["changed"] == Value::Bool(false) { "unchanged" } else { "weights set" };
                let all = output::variant_weights(&b["variants"]);
                format!("{object} {what}: {all} (revision {})\n", output::cell(&b["revision"]))
            });
            Ok(())
        }
        Command::Members { command } => {
            let body = match command.unwrap_or(MembersCommand::List) {
                MembersCommand::List => call(&mut c, Method::GET, "/v1/members", None).await?,
                MembersCommand::Add { id, addr, xds_addr, learner } => {
                    let mut b = json!({ "id": id, "addr": addr, "voter": !learner });
                    if let Some(x) = xds_addr {
                        b["xds_addr"] = json!(x);
                    }
                    call(&mut c, Method::POST, "/v1/members", Some(&b)).await?
                }
                MembersCommand::Remove { id } => {
                    call(&mut c, Method::DELETE, &format!("/v1/members/{id}"), None).await?
                }
            };
            show(format, &body, output::members_table);
            Ok(())
        }
        Command::Node { command: NodeCommand::List } => {
            let joined = node::gather_list(&mut c).await?;
            show(format, &joined, node::list_table);
            Ok(())
        }
        Command::Node { command: NodeCommand::Describe { name } } => {
            let name = parse_name(&name)?;
            let entry = node::gather_one(&mut c, name).await?;
            show(format, &entry, node::describe_text);
            Ok(())
        }
        Command::Schedule { command } => {
            let path = match command {
                ScheduleCommand::Status => {
                    let joined = schedule::gather_status(&mut c).await?;
                    show(format, &joined, schedule::status_table);
                    return Ok(());
                }
                ScheduleCommand::Plan { .. } => "/v1/schedule/plan",
                ScheduleCommand::Apply { .. } => "/v1/schedule/apply",
            };
            let body = call(&mut c, Method::POST, path, workloads.as_ref()).await?;
            for w in body["warnings"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                err_line(format!("warning: {w}"));
            }
            show(format, &body, schedule::plan_table);
            Ok(())
        }
        Command::Autoscale { command: AutoscaleCommand::Status } => {
            let body = call(&mut c, Method::GET, "/v1/autoscale/status", None).await?;
            show(format, &body, autoscale::status_table);
            Ok(())
        }
        Command::Autoscale { command: AutoscaleCommand::Preempt { node, autoscaler, replicas, notice_s } } => {
            if node.is_none() && autoscaler.is_none() {
                return Err(CliError::Usage("give --node, or --autoscaler and --replicas".into()));
            }
            let b = autoscale::notice(node, autoscaler, replicas, notice_s);
            let body = call(&mut c, Method::POST, "/v1/autoscale/preemption", Some(&b)).await?;
            show(format, &body, autoscale::preemption_table);
            Ok(())
        }
        Command::Stat { window } => {
            let load = call(&mut c, Method::GET, &format!("/v1/load?window={window}"), None).await?;
            let services = call(&mut c, Method::GET, "/v1/services", None).await?;
            let by_exp = stat::services_by_experiment(&services);
            show(format, &load, |l| stat::stat_table(l, &by_exp));
            Ok(())
        }
        Command::Training { command: TrainingCommand::Status { job } } => {
            let job = parse_name(&job)?;
            let body = call(&mut c, Method::GET, &format!("/v1/training/{job}"), None).await?;
            show(format, &body, training::status_table);
            Ok(())
        }
        Command::Training { command: TrainingCommand::Scale { job, workers } } => {
            let job = parse_name(&job)?;
            let body = call(&mut c, Method::POST, &format!("/v1/training/{job}/scale"), Some(&json!({ "workers": workers }))).await?;
            show(format, &body, |b| format!("trainingjob/{job} scaled to {workers} workers (revision {}); the new shard map follows\n", output::cell(&b["revision"])));
            Ok(())
        }
        Command::Training { command: TrainingCommand::Checkpoint { job, after_steps } } => {
            let job = parse_name(&job)?;
            let body = call(&mut c, Method::POST, &format!("/v1/training/{job}/checkpoint"), Some(&json!({ "after_steps": after_steps }))).await?;
            show(format, &body, |b| {
                format!("trainingjob/{job}: every rank of map v{} checkpoints at step {} (the furthest rank was at {})\n",
                    output::cell(&b["map_version"]), output::cell(&b["step"]), output::cell(&b["furthest_rank_step"]))
            });
            Ok(())
        }
        Command::Identity { command: IdentityCommand::Ca } => {
            let body = call(&mut c, Method::GET, "/v1/identity/ca", None).await?;
            show(format, &body, |b| b["cert_pem"].as_str().unwrap_or_default().to_string());
            Ok(())
        }
        Command::Identity { command: IdentityCommand::Revoke { identity } } => {
            let ca = call(&mut c, Method::GET, "/v1/identity/ca", None).await?;
            let td = ca["trust_domain"].as_str().unwrap_or_default().to_string();
            let id = if identity.starts_with("spiffe://") { identity.clone() } else { format!("spiffe://{td}/{}", identity.trim_start_matches('/')) };
            let tokens = call(&mut c, Method::GET, "/v1/identity/tokens", None).await?;
            let mut revoked = Vec::new();
            for t in tokens["items"].as_array().into_iter().flatten().filter(|t| t["identity"] == id.as_str()) {
                let tid = output::cell(&t["id"]);
                call(&mut c, Method::DELETE, &format!("/v1/identity/tokens/{tid}"), None).await?;
                revoked.push(tid);
            }
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            let name: String = id.trim_start_matches("spiffe://").chars().map(|ch| if ch.is_ascii_alphanumeric() || ch == '-' || ch == '_' || ch == '.' { ch } else { '-' }).collect();
            let body = call(&mut c, Method::PUT, &format!("/v1/revocations/{name}"), Some(&json!({"identity": id, "issued_before": now}))).await?;
            let out = json!({"identity": id, "revocation": name, "issued_before": now, "tokens_revoked": revoked, "revision": body["revision"]});
            show(format, &out, |_| {
                format!("{id}: certificates issued before {now} are refused by every sidecar (revocations/{name}); {} join token(s) revoked\n", revoked.len())
            });
            Ok(())
        }
        Command::Identity { command: IdentityCommand::Token { command } } => {
            match command {
                TokenCommand::Create { identity, ttl, description } => {
                    let req = json!({ "identity": identity, "ttl": ttl, "description": description });
                    let body = call(&mut c, Method::POST, "/v1/identity/tokens", Some(&req)).await?;
                    show(format, &body, |b| {
                        let expires = match b["expires"].as_u64() {
                            Some(0) | None => "never expires".to_string(),
                            Some(t) => format!("expires at {t} (Unix seconds)"),
                        };
                        format!("{}\n# join token {} for {}; {expires}; shown only now\n", output::cell(&b["token"]), output::cell(&b["id"]), output::cell(&b["identity"]))
                    });
                }
                TokenCommand::List => {
                    let body = call(&mut c, Method::GET, "/v1/identity/tokens", None).await?;
                    show(format, &body, |b| {
                        let rows: Vec<Vec<String>> = b["items"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|t| ["id", "identity", "created", "expires", "description"].iter().map(|k| output::cell(&t[*k])).collect())
                            .collect();
                        output::table(&["ID", "IDENTITY", "CREATED", "EXPIRES", "DESCRIPTION"], &rows)
                    });
                }
                TokenCommand::Revoke { id } => {
                    let body = call(&mut c, Method::DELETE, &format!("/v1/identity/tokens/{id}"), None).await?;
                    show(format, &body, |_| format!("join token {id} revoked\n"));
                }
            }
            Ok(())
        }
        Command::ProxyStatus => {
            let body = call(&mut c, Method::GET, "/v1/proxies", None).await?;
            for u in body["unreachable"].as_array().into_iter().flatten() {
                err_line(format!(
                    "warning: control node {} ({}) did not answer; its sidecars are missing: {}",
                    output::cell(&u["id"]),
                    output::cell(&u["addr"]),
                    output::cell(&u["error"])
                ));
            }
            show(format, &body, output::proxies_table);
            Ok(())
        }
        Command::Status => {
            let body = call(&mut c, Method::GET, "/v1/status", None).await?;
            show(format, &body, output::status_table);
            Ok(())
        }
    }
}

/// The whole program: flags (clap exits 2 on bad usage), a current-thread runtime (one
/// request at a time needs no more), and `error: ...` lines with the exit code on failure.
pub fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            err_line(format!("error: starting the runtime: {e}"));
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            for line in e.message().lines() {
                err_line(format!("error: {line}"));
            }
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_from_the_command_line() {
        for (s, k) in [
            ("services", Kind::Services),
            ("Service", Kind::Services),
            ("Cluster", Kind::Clusters),
            ("endpoints", Kind::Endpoints),
            ("experiment", Kind::Experiments),
            ("node", Kind::Nodes),
            ("Placement", Kind::Placements),
            ("autoscaler", Kind::Autoscalers),
            ("ScalingDecision", Kind::ScalingDecisions),
            ("NodeStatus", Kind::NodeStatuses),
            ("nodestatus", Kind::NodeStatuses),
        ] {
            assert_eq!(parse_kind(s), Ok(k), "{s}");
        }
        let e = parse_kind("pods").unwrap_err();
        assert_eq!(
            e,
            CliError::Usage("unknown kind \"pods\"; expected one of clusters, endpoints, experiments, services, nodes, placements, nodestatuses, autoscalers, scalingdecisions, rollouts, rolloutstates, trainingjobs, shardmaps, checkpoints, authorizationpolicies, revocations".into())
        );
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn weights_syntax() {
        let w = parse_weights(&["a=90".into(), " b = 10".into()]).unwrap();
        assert_eq!(Value::Object(w), json!({"a": 90, "b": 10}));
        for bad in ["a", "=5", "a=-1", "a=x", "a=1.5"] {
            assert!(matches!(parse_weights(&[bad.into()]), Err(CliError::Usage(_))), "{bad}");
        }
        assert!(parse_weights(&["a=1".into(), "a=2".into()]).unwrap_err().message().contains("twice"));
        assert_eq!(parse_name("chat-a.v2"), Ok("chat-a.v2"));
        for bad in ["a b", "a/b", "", "é"] {
            assert!(matches!(parse_name(bad), Err(CliError::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn command_lines_parse() {
        let a = Args::try_parse_from(["weftctl", "apply", "-f", "-", "--dry-run", "-o", "json"]).unwrap();
        assert_eq!(a.output, Format::Json);
        assert!(matches!(a.command, Command::Apply { ref file, dry_run: true, allow_dangling: false } if file == "-"));
        let a = Args::try_parse_from(["weftctl", "--server", "http://a:1,http://b:2", "members"]).unwrap();
        assert!(matches!(a.command, Command::Members { command: None }));
        let a = Args::try_parse_from(["weftctl", "members", "add", "2", "h:1", "--learner"]).unwrap();
        assert!(matches!(
            a.command,
            Command::Members { command: Some(MembersCommand::Add { id: 2, learner: true, xds_addr: None, .. }) }
        ));
        let a = Args::try_parse_from(["weftctl", "rollback", "service", "chat", "--to", "5"]).unwrap();
        assert!(matches!(a.command, Command::Rollback { to: 5, .. }));
        assert!(Args::try_parse_from(["weftctl", "experiment", "set-weights", "ab"]).is_err(), "weights are required");
        assert!(Args::try_parse_from(["weftctl", "-o", "xml", "status"]).is_err());
        assert!(Args::try_parse_from(["weftctl", "rollback", "service", "chat", "--to", "x"]).is_err());
        let a = Args::try_parse_from(["weftctl", "node", "describe", "gpu-1", "-o", "yaml"]).unwrap();
        assert!(matches!(a.command, Command::Node { command: NodeCommand::Describe { ref name } } if name == "gpu-1"));
        assert_eq!(a.output, Format::Yaml);
        assert!(matches!(Args::try_parse_from(["weftctl", "node", "list"]).unwrap().command, Command::Node { command: NodeCommand::List }));
        let a = Args::try_parse_from(["weftctl", "schedule", "status"]).unwrap();
        assert!(matches!(a.command, Command::Schedule { command: ScheduleCommand::Status }));
    }
}
