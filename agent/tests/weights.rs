//! The weight files, the forward step and one base shared between processes, through the real
//! binaries where it matters (a kill -9 of one replica, a holder that dies).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use weft_agent::server::{self, BaseSource};
use weft_agent::weights::model::{self, Base, Delta, Dims};
use weft_agent::weights::{make, share};

const DIMS: Dims = Dims { layers: 4, d: 32, classes: 10 };

struct Files {
    _dir: tempfile::TempDir,
    base: PathBuf,
    lora: PathBuf,
    head: PathBuf,
    dir: PathBuf,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().to_path_buf();
    let f = Files { base: p.join("base.safetensors"), lora: p.join("a.safetensors"), head: p.join("b.safetensors"), dir: p, _dir: dir };
    make::base(&f.base, DIMS, 1).unwrap();
    make::delta(&f.lora, DIMS, 4, false, 2).unwrap();
    make::delta(&f.head, DIMS, 0, true, 3).unwrap();
    f
}

fn logits(model: &server::Model) -> Vec<f32> {
    serde_json::from_value(server::answer(model, b"").unwrap()["logits"].clone()).unwrap()
}

#[test]
fn each_delta_changes_the_answer_and_equal_models_agree() {
    let f = files();
    let plain = server::load("base", &BaseSource::File(f.base.clone()), None).unwrap();
    let lora = server::load("a", &BaseSource::File(f.base.clone()), Some(&f.lora)).unwrap();
    let head = server::load("b", &BaseSource::File(f.base.clone()), Some(&f.head)).unwrap();
    let again = server::load("a", &BaseSource::File(f.base.clone()), Some(&f.lora)).unwrap();
    let (p, l, h) = (logits(&plain), logits(&lora), logits(&head));
    assert_ne!(p, l, "the LoRA pairs change the output");
    assert_ne!(p, h, "the head changes the output");
    assert_ne!(l, h);
    assert_eq!(l, logits(&again), "deterministic");
    assert!(p.iter().all(|v| v.is_finite() && v.abs() < 1e4), "activations stay bounded: {p:?}");
    let a = server::answer(&lora, br#"{"input": [1, 2, 3]}"#).unwrap();
    assert_eq!(a["variant"], "a");
    let bad = server::answer(&lora, br#"{"input": "x"}"#).unwrap_err();
    assert!(bad.contains("input"), "{bad}");
}

#[test]
fn a_delta_for_another_base_is_refused_naming_the_tensor_and_shapes() {
    let f = files();
    let wrong = f.dir.join("wrong.safetensors");
    make::delta(&wrong, Dims { d: 48, ..DIMS }, 4, false, 9).unwrap();
    let e = server::load("x", &BaseSource::File(f.base.clone()), Some(&wrong)).err().unwrap();
    assert!(e.contains("layers.0.lora_a") && e.contains("[4, 48]") && e.contains("32"), "{e}");

    let head = f.dir.join("head.safetensors");
    make::delta(&head, Dims { classes: 3, ..DIMS }, 0, true, 9).unwrap();
    let e = server::load("x", &BaseSource::File(f.base.clone()), Some(&head)).err().unwrap();
    assert!(e.contains("head.weight") && e.contains("[3, 32]") && e.contains("[10, 32]"), "{e}");

    let deeper = f.dir.join("deeper.safetensors");
    make::delta(&deeper, Dims { layers: 6, ..DIMS }, 2, false, 9).unwrap();
    let e = server::load("x", &BaseSource::File(f.base.clone()), Some(&deeper)).err().unwrap();
    assert!(e.contains("layers.4") && e.contains("4 layers"), "{e}");

    let missing = server::load("x", &BaseSource::File(f.dir.join("nope.safetensors")), None).err().unwrap();
    assert!(missing.contains("nope.safetensors"), "{missing}");
    std::fs::write(f.dir.join("junk.safetensors"), b"not a model").unwrap();
    let junk = server::load("x", &BaseSource::File(f.dir.join("junk.safetensors")), None).err().unwrap();
    assert!(junk.contains("not a safetensors file"), "{junk}");
    // A delta is not a base.
    let e = Base::new(model::read_packed(&f.lora).unwrap()).err().unwrap();
    assert!(e.contains("layers.0.weight"), "{e}");
    let _ = Delta::new(model::read_packed(&f.lora).unwrap(), DIMS).unwrap();
}

#[test]
fn a_shared_base_is_sealed_counted_and_computes_what_the_file_does() {
    let f = files();
    let published = share::publish(model::read_packed(&f.base).unwrap(), "test-base").unwrap();
    let socket = f.dir.join("holder.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let users = Arc::new(AtomicUsize::new(0));
    let counted = users.clone();
    std::thread::spawn(move || share::serve(listener, &published, counted));

    let shared = server::load("a", &BaseSource::Holder(socket.clone()), Some(&f.lora)).unwrap();
    let second = server::load("b", &BaseSource::Holder(socket.clone()), Some(&f.head)).unwrap();
    let heap = server::load("a", &BaseSource::File(f.base.clone()), Some(&f.lora)).unwrap();
    assert_eq!(logits(&shared), logits(&heap), "the mapped base is the file's base");
    wait(|| users.load(Ordering::SeqCst) == 2, "two users counted");
    drop(second);
    wait(|| users.load(Ordering::SeqCst) == 1, "a replica that went away is no longer counted");
    assert_eq!(logits(&shared), logits(&heap), "and the other still reads the base");

    let gone = server::load("x", &BaseSource::Holder(f.dir.join("none.sock")), None).err().unwrap();
    assert!(gone.contains("weight holder") && gone.contains("none.sock"), "{gone}");
}

fn wait(mut ok: impl FnMut() -> bool, what: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < until, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child killed when the test ends, however it ends.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn holder(base: &Path, socket: &Path) -> Proc {
    let mut c = Command::new(env!("CARGO_BIN_EXE_weft-agent"))
        .args(["hold", "--base"])
        .arg(base)
        .arg("--socket")
        .arg(socket)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stderr.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains("shared on"), "holder: {line}");
    Proc(c)
}

fn replica(socket: &Path, delta: &Path, variant: &str) -> (Proc, u16) {
    let port = free_port();
    let c = Command::new(env!("CARGO_BIN_EXE_weft-model-server"))
        .args(["--port", &port.to_string(), "--variant", variant, "--holder"])
        .arg(socket)
        .arg("--delta")
        .arg(delta)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait(|| get(port, "/healthz").is_some(), "replica ready");
    (Proc(c), port)
}

/// The body of a request to `path` on `port` (None: no answer).
fn get(port: u16, path: &str) -> Option<serde_json::Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    serde_json::from_str(out.split_once("\r\n\r\n")?.1).ok()
}

#[test]
fn killing_one_replica_leaves_the_base_to_the_others_and_a_dead_holder_stops_them() {
    let f = files();
    let socket = f.dir.join("holder.sock");
    let mut hold = holder(&f.base, &socket);
    let (mut a, pa) = replica(&socket, &f.lora, "a");
    let (mut b, pb) = replica(&socket, &f.head, "b");
    let before = get(pb, "/v1/infer").unwrap();
    assert_eq!(before["variant"], "b");
    assert_ne!(get(pa, "/v1/infer").unwrap()["logits"], before["logits"], "each variant answers with its own delta");

    // kill -9 one replica: the other keeps computing on the same base.
    a.0.kill().unwrap();
    a.0.wait().unwrap();
    assert_eq!(get(pb, "/v1/infer").unwrap(), before);

    // A second holder on the same socket is refused while the first lives.
    let out = Command::new(env!("CARGO_BIN_EXE_weft-agent")).args(["hold", "--base"]).arg(&f.base).arg("--socket").arg(&socket).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("another weight holder"));

    // The holder dies: its replicas exit (status 3) so their supervisor restarts them with it.
    hold.0.kill().unwrap();
    hold.0.wait().unwrap();
    let status = (0..250).find_map(|_| {
        std::thread::sleep(Duration::from_millis(20));
        b.0.try_wait().unwrap()
    });
    assert_eq!(status.and_then(|s| s.code()), Some(3), "the replica saw its holder go");
}
