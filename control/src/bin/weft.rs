//! `weft`: the user-facing entry point. `weft demo` runs the first-run tour (see
//! `weft_control::demo`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use weft_control::demo::{self, DemoOptions};

#[derive(Parser)]
#[command(name = "weft", version, about = "weft: a service mesh for AI inference")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a demo mesh on 127.0.0.1: an in-process control plane, two model variants (b a bit
    /// slower, with more errors) behind weft sidecars, a 50/50 experiment sticky by user id,
    /// live traffic, then the A/B report (terminal + HTML). Ctrl-C stops everything it started.
    Demo(DemoArgs),
}

#[derive(clap::Args)]
struct DemoArgs {
    /// How long to drive traffic, in seconds.
    #[arg(long, default_value_t = 30, conflicts_with = "quick")]
    seconds: u64,
    /// A short run: 8 seconds of traffic.
    #[arg(long)]
    quick: bool,
    /// Seconds of warm-up at the start, excluded from the report (default: a sixth of the run, at least 1).
    #[arg(long)]
    warmup: Option<u64>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// First of the 10 consecutive loopback ports the demo listens on.
    #[arg(long, default_value_t = 17700)]
    listen_base: u16,
    /// Where to write the HTML report.
    #[arg(long, default_value = "weft-demo-report.html")]
    report: PathBuf,
    /// Directory holding weft-proxy and weft-model-sim (default: next to this executable).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Distinct user ids the clients send (x-user-id), each sticky to one variant.
    #[arg(long, default_value_t = 10_000)]
    users: u64,
    /// Sidecars talk plaintext to each other (default: mutual TLS, strict, with certificates
    /// from the control plane's CA).
    #[arg(long)]
    plaintext: bool,
}

fn main() {
    let Cli { command: Cmd::Demo(a) } = Cli::parse();
    let seconds = if a.quick { 8 } else { a.seconds };
    let opts = DemoOptions {
        seconds,
        warmup_s: a.warmup.unwrap_or((seconds / 6).max(1)),
        concurrency: a.concurrency,
        listen_base: a.listen_base,
        report: a.report,
        bin_dir: a.bin_dir,
        users: a.users,
        plaintext: a.plaintext,
    };
    std::process::exit(demo::main(opts));
}
