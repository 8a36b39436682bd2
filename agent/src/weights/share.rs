//! One copy of a base model's weights for every replica on a node (on CPU): the holder packs
//! the base into a memfd, seals it against any change, and hands the descriptor to each
//! replica over a unix socket (SCM_RIGHTS) with the [`Manifest`]; each replica maps it
//! read-only. The pages are the kernel's, shared by every mapping: N replicas cost one base
//! (each process's PSS carries 1/N of it) plus their own deltas.
//!
//! Lifetime: a replica keeps its connection to the holder open for as long as it runs, which
//! is how the holder counts its users; the mapping itself keeps the pages alive, so a replica
//! that exits (or is killed) never frees the base under the others. A replica that sees its
//! holder's connection close exits, so whoever supervises it restarts both together (on a GPU,
//! CUDA IPC memory dies with the exporting process; the same rule holds on both).

use std::fs::File;
use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::Mmap;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

use super::model::{Manifest, Packed, checksum};

/// The seals a shared base must carry before anyone maps it: no writes, no resizing, and no
/// way to remove those.
fn required_seals() -> SealFlags {
    SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL
}

/// A read-only mapping of a sealed memfd, read as floats.
pub struct Mapped {
    map: Mmap,
    floats: usize,
}

impl AsRef<[f32]> for Mapped {
    fn as_ref(&self) -> &[f32] {
        // Checked in `map_sealed`: the mapping is page-aligned and holds `floats` floats.
        bytemuck::cast_slice(&self.map[..self.floats * 4])
    }
}

/// Maps `file` (a memfd) read-only, after checking its seals and size against `manifest`, and
/// checks the checksum (which also faults every page in).
fn map_sealed(file: &File, manifest: &Manifest) -> Result<Mapped, String> {
    let seals = rustix::fs::fcntl_get_seals(file).map_err(|e| format!("reading the shared base's seals: {e}"))?;
    if !seals.contains(required_seals()) {
        return Err(format!("the shared base is not sealed against changes (seals {seals:?})"));
    }
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let want = manifest.floats as u64 * 4;
    if len != want || want == 0 {
        return Err(format!("the shared base is {len} bytes; its manifest says {want}"));
    }
    // SAFETY: memmap2's contract is that the file is not modified or truncated while mapped.
    // The memfd carries F_SEAL_WRITE, F_SEAL_SHRINK and F_SEAL_GROW (checked just above), and
    // F_SEAL_SEAL so they cannot be lifted: the kernel refuses every write and resize, by any
    // process, for the mapping's whole life.
    #[allow(unsafe_code)]
    let map = unsafe { Mmap::map(file) }.map_err(|e| format!("mapping the shared base: {e}"))?;
    bytemuck::try_cast_slice::<u8, f32>(&map[..]).map_err(|e| format!("the shared base's mapping: {e:?}"))?;
    let mapped = Mapped { map, floats: manifest.floats };
    if checksum(mapped.as_ref()) != manifest.checksum {
        return Err("the shared base's checksum does not match its manifest".into());
    }
    Ok(mapped)
}

/// A base packed into a sealed memfd, mapped by its holder too (so the base is counted once,
/// in the holder, even before any replica attaches).
pub struct Published {
    pub packed: Packed<Mapped>,
    file: Arc<File>,
}

/// Moves `packed` into a sealed memfd (the heap copy is freed) and maps it.
pub fn publish(packed: Packed<Vec<f32>>, name: &str) -> Result<Published, String> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| format!("memfd_create: {e}"))?;
    let mut file = File::from(fd);
    file.write_all(bytemuck::cast_slice(&packed.storage)).map_err(|e| format!("filling the shared base: {e}"))?;
    let manifest = packed.manifest;
    drop(packed.storage);
    rustix::fs::fcntl_add_seals(&file, required_seals()).map_err(|e| format!("sealing the shared base: {e}"))?;
    let storage = map_sealed(&file, &manifest)?;
    Ok(Published { packed: Packed { manifest, storage }, file: Arc::new(file) })
}

/// Serves `base` on `listener` until the process exits: each connection gets the manifest and
/// the memfd, and counts as a user (in `users`) until it closes.
pub fn serve(listener: UnixListener, base: &Published, users: Arc<AtomicUsize>) {
    let hello = hello(&base.packed.manifest);
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let (file, hello, users) = (base.file.clone(), hello.clone(), users.clone());
        std::thread::spawn(move || {
            if let Err(e) = send_hello(&conn, &hello, &file) {
                eprintln!("weft-agent hold: handing the base to a replica failed: {e}");
                return;
            }
            users.fetch_add(1, Ordering::SeqCst);
            // The replica never writes; EOF (or an error) is its exit.
            let _ = conn.read(&mut [0u8; 1]);
            users.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// The first message: the manifest's JSON after its length (u32, little-endian).
fn hello(manifest: &Manifest) -> Vec<u8> {
    let json = serde_json::to_vec(manifest).expect("a manifest serializes");
    let mut out = (json.len() as u32).to_le_bytes().to_vec();
    out.extend(json);
    out
}

fn send_hello(conn: &UnixStream, hello: &[u8], file: &File) -> std::io::Result<()> {
    let fds = [file.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let sent = rustix::net::sendmsg(conn, &[std::io::IoSlice::new(hello)], &mut control, SendFlags::empty())?;
    (&*conn).write_all(&hello[sent..])
}

/// A replica's side: connects to the holder at `socket`, receives and maps the base. The
/// returned stream must be kept open while the base is in use (it is the holder's count of
/// users, and its closing says the holder is gone).
pub fn attach(socket: &Path) -> Result<(Packed<Mapped>, UnixStream), String> {
    let ctx = |e: std::io::Error| format!("weight holder {}: {e}", socket.display());
    let mut conn = UnixStream::connect(socket).map_err(ctx)?;
    let mut first = vec![0u8; 64 << 10];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(&conn, &mut [std::io::IoSliceMut::new(&mut first)], &mut control, RecvFlags::CMSG_CLOEXEC)
        .map_err(|e| ctx(e.into()))?
        .bytes;
    let mut fd: Option<OwnedFd> = None;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = msg {
            fd = fd.or_else(|| fds.next());
        }
    }
    let fd = fd.ok_or_else(|| format!("weight holder {}: no descriptor in its answer", socket.display()))?;
    if got < 4 {
        return Err(format!("weight holder {}: short answer ({got} bytes)", socket.display()));
    }
    let len = u32::from_le_bytes([first[0], first[1], first[2], first[3]]) as usize;
    let mut json = first[4..got].to_vec();
    if json.len() < len {
        let mut rest = vec![0u8; len - json.len()];
        conn.read_exact(&mut rest).map_err(ctx)?;
        json.extend(rest);
    }
    let manifest: Manifest =
        serde_json::from_slice(&json[..len]).map_err(|e| format!("weight holder {}: bad manifest: {e}", socket.display()))?;
    let storage = map_sealed(&File::from(fd), &manifest)?;
    Ok((Packed { manifest, storage }, conn))
}

/// A base's floats wherever they live: read from its file into this process's heap, or mapped
/// from a holder's shared copy.
pub enum Weights {
    Heap(Vec<f32>),
    Shared(Mapped),
}

impl AsRef<[f32]> for Weights {
    fn as_ref(&self) -> &[f32] {
        match self {
            Weights::Heap(v) => v,
            Weights::Shared(m) => m.as_ref(),
        }
    }
}
