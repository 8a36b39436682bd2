//! `weft-agent hold --base FILE --socket PATH`: the node's weight holder for one base model;
//! `weft-agent make-base` / `make-delta`: write model files of a given shape.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use weft_agent::weights::{make, model, share};

#[derive(Parser)]
#[command(version, about = "weft node agent: shares one copy of a base model's weights with every variant replica on the node")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

/// A base's shape (a delta is made for the base it adapts).
#[derive(clap::Args)]
struct Shape {
    #[arg(long, default_value_t = 8)]
    layers: usize,
    #[arg(long, default_value_t = 256)]
    d: usize,
    #[arg(long, default_value_t = 16)]
    classes: usize,
}

impl Shape {
    fn dims(&self) -> model::Dims {
        model::Dims { layers: self.layers, d: self.d, classes: self.classes }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Load a base once into a sealed memfd and hand it to replicas on a unix socket.
    Hold {
        /// The base's safetensors file.
        #[arg(long)]
        base: PathBuf,
        /// Unix socket replicas connect to (`weft-model-server --holder`).
        #[arg(long)]
        socket: PathBuf,
        /// Exit once no replica has used the base for this many seconds, after the first one
        /// came (0: hold until stopped).
        #[arg(long, default_value_t = 0)]
        exit_when_unused_s: u64,
    },
    /// Write a base of `layers` layers of `d`×`d` and a `classes`×`d` head.
    MakeBase {
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        shape: Shape,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Write a delta for a base of the given shape: LoRA pairs of `rank` and/or a head.
    MakeDelta {
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        shape: Shape,
        #[arg(long, default_value_t = 8)]
        rank: usize,
        /// Give the variant its own head too.
        #[arg(long)]
        head: bool,
        #[arg(long, default_value_t = 2)]
        seed: u64,
    },
}

fn main() {
    let result = match Args::parse().command {
        Command::Hold { base, socket, exit_when_unused_s } => hold(&base, &socket, exit_when_unused_s),
        Command::MakeBase { out, shape, seed } => make::base(&out, shape.dims(), seed),
        Command::MakeDelta { out, shape, rank, head, seed } => make::delta(&out, shape.dims(), rank, head, seed),
    };
    if let Err(e) = result {
        eprintln!("weft-agent: {e}");
        std::process::exit(1);
    }
}

fn hold(base: &std::path::Path, socket: &std::path::Path, exit_when_unused_s: u64) -> Result<(), String> {
    let started = Instant::now();
    // Refuse a file that is not a base before anyone maps it.
    let checked = model::Base::new(model::read_packed(base)?)?;
    let (dims, packed) = (checked.dims, checked.packed);
    let name = base.file_stem().map_or("weft-base".into(), |s| s.to_string_lossy().into_owned());
    let published = share::publish(packed, &name)?;
    // A socket left by a holder that died is in the way; a live holder's is not ours to take.
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        return Err(format!("{}: another weight holder is serving there", socket.display()));
    }
    let _ = std::fs::remove_file(socket);
    let listener = std::os::unix::net::UnixListener::bind(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    eprintln!(
        "weft-agent hold: {} ({} layers of {}x{}, {:.1} MiB) shared on {} after {:.0} ms",
        base.display(),
        dims.layers,
        dims.d,
        dims.d,
        published.packed.manifest.floats as f64 * 4.0 / (1 << 20) as f64,
        socket.display(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let users = Arc::new(AtomicUsize::new(0));
    if exit_when_unused_s > 0 {
        let users = users.clone();
        std::thread::spawn(move || {
            let (mut seen, mut idle_since) = (false, None);
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let n = users.load(Ordering::SeqCst);
                seen |= n > 0;
                idle_since = if n == 0 { idle_since.or(Some(Instant::now())) } else { None };
                if seen && idle_since.is_some_and(|t| t.elapsed() >= Duration::from_secs(exit_when_unused_s)) {
                    eprintln!("weft-agent hold: no replica has used the base for {exit_when_unused_s} s; exiting");
                    std::process::exit(0);
                }
            }
        });
    }
    share::serve(listener, &published, users);
    Ok(())
}
