//! `weft-k8s`: weft's Kubernetes pieces in one binary (one image).
//!
//! - `weft-k8s inject --tls-cert F --tls-key F`: the sidecar injector webhook.
//! - `weft-k8s sync --control URL`: weft's custom resources and meshed Services' EndpointSlices
//!   → weft-control.
//! - `weft-k8s crds`: print the CRDs (deploy/kubernetes/crds.yaml is this output).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use weft_control::tls::{CertSource, Serving};
use weft_k8s::inject::Settings;

#[derive(Parser)]
#[command(version, about = "weft on Kubernetes: the sidecar injector webhook, the CRD and EndpointSlice sync, the CRDs")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, default_value = "info", global = true)]
    log: String,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the mutating admission webhook that injects weft-proxy (POST /inject, GET /healthz).
    Inject(InjectArgs),
    /// Write weft's custom resources and meshed Services' EndpointSlices to weft-control, and
    /// the custom resources' status back.
    Sync(SyncArgs),
    /// Print weft's CustomResourceDefinitions as YAML (kubectl apply -f -).
    Crds,
}

#[derive(clap::Args)]
struct SyncArgs {
    /// weft-control's API, comma-separated nodes (any node takes writes; followers forward).
    #[arg(long, value_delimiter = ',', default_value = "http://weft-control.weft-system.svc:7700")]
    control: Vec<String>,
    /// File holding a bearer token with the operator role (weft-control --tokens).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Roots (PEM) to check an https:// control plane's certificate against.
    #[arg(long)]
    ca: Option<PathBuf>,
}

#[derive(clap::Args)]
struct InjectArgs {
    /// Where the webhook listens (HTTPS).
    #[arg(long, default_value = "0.0.0.0:9443")]
    listen: SocketAddr,
    /// The webhook's serving certificate chain (PEM); reread when it changes.
    #[arg(long)]
    tls_cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    #[arg(long)]
    tls_key: PathBuf,
    /// The image of the injected sidecar (weft-proxy; iptables for --redirect pods).
    #[arg(long, default_value = "weft:latest")]
    image: String,
    #[arg(long, default_value = "IfNotPresent")]
    image_pull_policy: String,
    /// An image with iptables for pods annotated weft.dev/redirect: iptables (their init step);
    /// without it such pods are denied, saying so.
    #[arg(long)]
    redirect_image: Option<String>,
    /// The control plane's xDS addresses the sidecars dial, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "weft-control.weft-system.svc:7701")]
    xds: Vec<String>,
    /// A ConfigMap (in each pod's namespace) holding the mesh root as `ca.crt`: sidecars then
    /// dial xDS over TLS, checked against it.
    #[arg(long)]
    xds_ca_config_map: Option<String>,
    /// Sidecar CPU and memory requests unless a pod's weft.dev/proxy-cpu|memory says otherwise.
    #[arg(long, default_value = "100m")]
    proxy_cpu: String,
    #[arg(long, default_value = "128Mi")]
    proxy_memory: String,
}

fn main() {
    let args = Args::parse();
    weft_proxy::logging::init(tracing_subscriber::EnvFilter::try_new(&args.log).unwrap_or_else(|_| "info".into()));
    let result = match args.cmd {
        Cmd::Crds => {
            print!("{}", weft_k8s::crds::yaml());
            Ok(())
        }
        Cmd::Inject(a) => inject(a),
        Cmd::Sync(a) => sync(a),
    };
    if let Err(e) = result {
        eprintln!("weft-k8s: {e}");
        std::process::exit(1);
    }
}

fn inject(a: InjectArgs) -> Result<(), String> {
    let settings = Settings {
        image: a.image,
        image_pull_policy: a.image_pull_policy,
        redirect_image: a.redirect_image,
        xds: a.xds,
        xds_ca_config_map: a.xds_ca_config_map,
        default_cpu: a.proxy_cpu,
        default_memory: a.proxy_memory,
        ..Settings::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let serving = Serving::new(CertSource::Files { cert: a.tls_cert, key: a.tls_key }, "--tls-cert/--tls-key")?;
        let tls = serving.server_config(&[b"h2", b"http/1.1"])?;
        let listener = tokio::net::TcpListener::bind(a.listen).await.map_err(|e| format!("--listen {}: {e}", a.listen))?;
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        tokio::spawn(serving.keep_fresh(stop.clone()));
        tokio::spawn(async move {
            weft_proxy::signals::stop_requested().await;
            let _ = stop_tx.send(true);
        });
        tracing::info!(listen = %a.listen, "weft-k8s injector serving {}", weft_k8s::webhook::PATH);
        weft_k8s::webhook::serve(listener, tls, Arc::new(settings), stop).await.map_err(|e| e.to_string())
    })
}

fn sync(a: SyncArgs) -> Result<(), String> {
    use weft_control::cli::client::{Client, Server};
    let servers = a.control.iter().map(|u| Server::parse(u, a.ca.is_some())).collect::<Result<Vec<_>, _>>().map_err(|e| format!("--control: {e}"))?;
    let token = match &a.token_file {
        Some(p) => Some(std::fs::read_to_string(p).map_err(|e| format!("--token-file {}: {e}", p.display()))?.trim().to_string()),
        None => None,
    };
    let mut client = Client::new(servers, token);
    if let Some(ca) = &a.ca {
        client = client.with_tls(weft_control::tls::dial::Dialer::from_files(ca, None)?);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        // In a pod: its service account; elsewhere: the kubeconfig.
        let kube = kube::Client::try_default().await.map_err(|e| format!("Kubernetes API: {e}"))?;
        tracing::info!(control = ?a.control, "weft-k8s sync: watching weft.dev resources and meshed EndpointSlices");
        tokio::select! {
            _ = weft_k8s::sync::run(kube, std::sync::Arc::new(weft_k8s::sync::Weft::new(client))) => Ok(()),
            _ = weft_proxy::signals::stop_requested() => Ok(()),
        }
    })
}
