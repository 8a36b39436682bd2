//! `weft-model-server --port P --variant V (--base FILE | --holder SOCKET) [--delta FILE]`.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use weft_agent::server::{self, BaseSource};

#[derive(Parser)]
#[command(version, about = "weft's reference model server: a base plus a variant's delta from safetensors files, a real forward step per request")]
#[command(group(clap::ArgGroup::new("weights").required(true)))]
struct Args {
    /// Port to listen on (127.0.0.1 unless --address says otherwise).
    #[arg(long)]
    port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
    /// The variant's name, echoed in every answer.
    #[arg(long, default_value = "")]
    variant: String,
    /// Read the base from this safetensors file into this process (no sharing).
    #[arg(long, group = "weights")]
    base: Option<PathBuf>,
    /// Map the base shared by the weight holder on this unix socket (`weft-agent hold`).
    #[arg(long, group = "weights")]
    holder: Option<PathBuf>,
    /// The variant's delta: a safetensors file of LoRA pairs and/or a head.
    #[arg(long)]
    delta: Option<PathBuf>,
}

/// Exit status when the weight holder goes away (the supervisor restarts holder and replicas).
const HOLDER_GONE: i32 = 3;

fn main() {
    let args = Args::parse();
    let source = match (args.base, args.holder) {
        (Some(f), _) => BaseSource::File(f),
        (None, Some(s)) => BaseSource::Holder(s),
        (None, None) => unreachable!("clap requires one"),
    };
    let model = match server::load(&args.variant, &source, args.delta.as_deref()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("weft-model-server: {e}");
            std::process::exit(1);
        }
    };
    if let Some(conn) = &model.holder {
        let mut conn = conn.try_clone().expect("cloning a unix socket");
        std::thread::spawn(move || {
            let _ = conn.read(&mut [0u8; 1]);
            eprintln!("weft-model-server: the weight holder closed its connection; exiting so the base is reloaded");
            std::process::exit(HOLDER_GONE);
        });
    }
    let dims = model.base.dims;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind((args.address.as_str(), args.port)).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("weft-model-server: listening on {}:{}: {e}", args.address, args.port);
                std::process::exit(1);
            }
        };
        eprintln!(
            "weft-model-server: variant {:?} ready on {}:{} ({} layers of {}x{}, {} classes, loaded in {:.0} ms)",
            model.variant, args.address, args.port, dims.layers, dims.d, dims.d, dims.classes, model.load_ms
        );
        tokio::select! {
            _ = server::serve(listener, Arc::new(model)) => {}
            _ = weft_proxy::signals::stop_requested() => {}
        }
    });
}
