//! The launch connection: one frame with the [`Launch`] as JSON, then the run's files as a
//! tar stream until the replica closes its side.
//!
//! Both ends stream: the tar side (the `tar` crate, blocking) runs in a blocking task and
//! exchanges chunks of at most [`CHUNK_BYTES`] with the async side over a bounded channel,
//! so a worktree of hundreds of megabytes is never held whole in memory.

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{KIND_LAUNCH, Launch, read_frame, write_frame};

/// The size of one chunk of the tar stream between the async and the blocking side.
const CHUNK_BYTES: usize = 64 * 1024;

/// How many chunks may wait between the two sides.
const CHUNKS_IN_FLIGHT: usize = 16;

/// The top-level entry of a git worktree that is never sent: a file pointing at the
/// replica's repository.
const GIT_ENTRY: &str = ".git";

/// Replica: sends `launch` as one frame, then the files of the directory `files` (a git
/// worktree: its top-level `.git` entry is skipped) as a tar stream, then shuts `w` down.
/// Symlinks are sent as symlinks, never followed; regular files keep their executable bit;
/// owners and times are not sent.
///
/// # Errors
///
/// The launch is larger than a frame, a file cannot be read, or writing failed.
pub async fn send_launch<W: AsyncWrite + Unpin + Send>(
    mut w: W,
    launch: &Launch,
    files: &Path,
) -> io::Result<()> {
    let json = serde_json::to_vec(launch).map_err(io::Error::other)?;
    write_frame(&mut w, KIND_LAUNCH, &json).await?;

    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(CHUNKS_IN_FLIGHT);
    let files = files.to_owned();
    let packer = tokio::task::spawn_blocking(move || pack(&files, tx));
    let mut written = Ok(());
    while let Some(chunk) = rx.recv().await {
        if let Err(e) = w.write_all(&chunk).await {
            written = Err(e);
            break;
        }
    }
    // A write error drops the receiver, so the packer stops at its next chunk.
    drop(rx);
    let packed = packer.await.map_err(io::Error::other)?;
    written?;
    packed?;
    w.flush().await?;
    w.shutdown().await
}

/// Writes the tar stream of `files` (but its top-level `.git`) into `tx`.
fn pack(files: &Path, tx: mpsc::Sender<Vec<u8>>) -> io::Result<()> {
    let writer = io::BufWriter::with_capacity(CHUNK_BYTES, ChannelWriter { tx });
    let mut builder = tar::Builder::new(writer);
    builder.follow_symlinks(false);
    // No owners, user names or times of the replica's files: only names, contents, the
    // executable bit and symlink targets matter.
    builder.mode(tar::HeaderMode::Deterministic);
    let mut names: Vec<_> = std::fs::read_dir(files)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read {}: {e}", files.display())))?
        .map(|entry| entry.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        if name == GIT_ENTRY {
            continue;
        }
        let path = files.join(&name);
        let metadata = std::fs::symlink_metadata(&path)?;
        if metadata.is_dir() {
            builder.append_dir_all(&name, &path)?;
        } else {
            builder.append_path_with_name(&path, &name)?;
        }
    }
    let mut writer = builder.into_inner()?;
    writer.flush()
}

/// A [`Write`] that sends what it is given, chunk by chunk, to the async side.
struct ChannelWriter {
    tx: mpsc::Sender<Vec<u8>>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK_BYTES);
        self.tx.blocking_send(buf[..n].to_vec()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the launch connection was closed while the files were sent",
            )
        })?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Pod: reads the [`Launch`] from the launch connection, then unpacks the tar stream that
/// follows into [`Launch::workdir`] (created if missing) until the end of the archive.
///
/// Unpacking is safe: an entry with an absolute path or a `..` component is refused, as is
/// anything but regular files, directories and symlinks (no hard links, devices or
/// FIFOs); nothing is written through a symlink (the `tar` crate's `unpack_in`, which
/// checks that the real parent of every entry is inside the directory); a symlink is made
/// as a symlink, wherever it points. More than `max_bytes` of file content is refused
/// before the entry that would pass it is written.
///
/// # Errors
///
/// A sentence: the launch cannot be read or is not valid (a relative `workdir` or `home`),
/// the stream ended before the end of the archive, an entry was refused, or a file could not
/// be written. What was unpacked before stays.
pub async fn receive_launch<R: AsyncRead + Unpin + Send>(
    mut r: R,
    max_bytes: u64,
) -> Result<Launch, String> {
    let frame = read_frame(&mut r)
        .await
        .map_err(|e| format!("cannot read the launch from the replica: {e}"))?;
    let launch: Launch = match frame {
        Some((super::KIND_LAUNCH, payload)) => serde_json::from_slice(&payload)
            .map_err(|e| format!("the replica's launch is not valid: {e}"))?,
        Some((kind, _)) => {
            return Err(format!(
                "the replica sent a frame of kind {kind:#04x} instead of the launch"
            ));
        }
        None => return Err("the replica closed the launch connection at once".to_owned()),
    };
    for (what, path) in [("workdir", &launch.workdir), ("home", &launch.home)] {
        if !Path::new(path).is_absolute() {
            return Err(format!(
                "the launch's {what} {path:?} is not an absolute path"
            ));
        }
    }
    let workdir = PathBuf::from(&launch.workdir);
    tokio::fs::create_dir_all(&workdir).await.map_err(|e| {
        format!(
            "cannot create the work directory {}: {e}",
            workdir.display()
        )
    })?;

    let (tx, rx) = mpsc::channel::<Vec<u8>>(CHUNKS_IN_FLIGHT);
    let unpacker = tokio::task::spawn_blocking(move || {
        unpack(
            ChannelReader {
                rx,
                chunk: Vec::new(),
                at: 0,
                ended: false,
            },
            &workdir,
            max_bytes,
        )
    });
    let mut read_error = None;
    loop {
        let mut chunk = vec![0u8; CHUNK_BYTES];
        match r.read(&mut chunk).await {
            Ok(0) => break,
            Ok(n) => {
                chunk.truncate(n);
                if tx.send(chunk).await.is_err() {
                    // The unpacker ended (done or refused): its answer says which.
                    break;
                }
            }
            Err(e) => {
                read_error = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let unpacked = unpacker
        .await
        .map_err(|e| format!("unpacking the files failed: {e}"))?;
    match (unpacked, read_error) {
        (Err(message), _) => Err(message),
        (Ok(()), Some(e)) => Err(format!("reading the files from the replica failed: {e}")),
        (Ok(()), None) => Ok(launch),
    }
}

/// A [`Read`] over the chunks the async side receives.
struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
    /// Whether a read found the end of the stream.
    ended: bool,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.chunk = chunk;
                    self.at = 0;
                }
                None => {
                    self.ended = true;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Unpacks the tar stream of `reader` into `workdir` (see [`receive_launch`]), then reads
/// what follows the end of the archive to the end of the stream.
fn unpack(reader: ChannelReader, workdir: &Path, max_bytes: u64) -> Result<(), String> {
    let mut archive = tar::Archive::new(reader);
    archive.set_overwrite(true);
    archive.set_preserve_permissions(false);
    archive.set_unpack_xattrs(false);
    let mut total: u64 = 0;
    let entries = archive
        .entries()
        .map_err(|e| format!("cannot read the files' archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("cannot read the files' archive: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("an entry of the files' archive has a bad path: {e}"))?
            .into_owned();
        let shown = path.display().to_string();
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(format!("refused the entry {shown:?}: its path has `..`"));
        }
        if path
            .components()
            .any(|c| matches!(c, Component::RootDir | Component::Prefix(_)))
        {
            return Err(format!("refused the entry {shown:?}: its path is absolute"));
        }
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_dir() || kind.is_symlink()) {
            return Err(format!(
                "refused the entry {shown:?}: only files, directories and symlinks are \
                 accepted (it is of tar type {:?})",
                kind.as_byte() as char
            ));
        }
        let size = entry
            .header()
            .size()
            .map_err(|e| format!("the entry {shown:?} has a bad size: {e}"))?;
        total = total.saturating_add(size);
        if total > max_bytes {
            return Err(format!(
                "the files are larger than the limit of {max_bytes} bytes (at {shown:?})"
            ));
        }
        let unpacked = entry
            .unpack_in(workdir)
            .map_err(|e| format!("cannot unpack {shown:?}: {e}"))?;
        if !unpacked {
            return Err(format!("refused the entry {shown:?}: it points outside"));
        }
    }
    let mut reader = archive.into_inner();
    if reader.ended {
        return Err(
            "the files' archive ended before its end marker (the replica's \
                    connection was cut)"
                .to_owned(),
        );
    }
    // The rest of the end marker: read to the end so that the replica's last writes land.
    io::copy(&mut reader, &mut io::sink())
        .map_err(|e| format!("reading the end of the files' archive failed: {e}"))?;
    Ok(())
}
