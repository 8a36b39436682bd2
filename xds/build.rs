//! Compiles `proto/weft/v1/*.proto` with `protox` (a pure-Rust protobuf compiler), so building
//! weft needs no system `protoc`. Well-known types (`google.protobuf.Duration`) map onto
//! `prost-types`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from("proto/weft/v1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    println!("cargo:rerun-if-changed=proto");
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, ["proto"])?;
    prost_build::Config::new()
        // `impl prost::Name` gives every message its full name and type URL.
        .enable_type_names()
        .type_name_domain(["."], "type.googleapis.com")
        // Maps keep a stable order, so encoding the same config twice gives the same bytes.
        .btree_map(["."])
        .compile_fds(fds)?;
    Ok(())
}
