//! Reading files that an agent could have replaced: in its `HOME` (Codex's session files),
//! its worktree (`.git`) or its run directory (`agent.pid`). The service reads them with
//! its own rights and often on the async runtime, so a symbolic link must not lead it to a
//! file of the service's, a FIFO must not block it, and a file that keeps growing must not
//! be read whole.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Opens the regular file `path` for reading: never through a symbolic link at `path`
/// (`O_NOFOLLOW`), never blocking on a FIFO or a device (`O_NONBLOCK`; the opened file is
/// then checked to be a regular file), so a file swapped for one of those between a check
/// and the open is refused, not read.
///
/// # Errors
///
/// It cannot be opened, or it is not a regular file.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(file)
}

/// The content of the regular file `path` (not a symbolic link) when it is at most `max`
/// bytes long; `None` when it is absent, not a regular file, longer, or unreadable. Never
/// reads more than `max + 1` bytes, whatever the file grows to after its size was checked.
pub(crate) fn read_small(path: &Path, max: u64) -> Option<Vec<u8>> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > max {
        return None;
    }
    let mut content = Vec::new();
    open_regular(path)
        .ok()?
        .take(max + 1)
        .read_to_end(&mut content)
        .ok()?;
    (content.len() as u64 <= max).then_some(content)
}

/// [`read_small`] of a UTF-8 text.
pub(crate) fn read_small_text(path: &Path, max: u64) -> Option<String> {
    String::from_utf8(read_small(path, max)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_reads_are_bounded_and_refuse_links_and_fifos() {
        let dir = tempfile::TempDir::new().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "gitdir: x\n").unwrap();
        assert_eq!(read_small(&file, 10).unwrap(), b"gitdir: x\n");
        assert_eq!(read_small_text(&file, 64).as_deref(), Some("gitdir: x\n"));
        assert_eq!(read_small(&file, 4), None);
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_small(&link, 64), None);
        assert!(open_regular(&link).is_err());
        assert_eq!(read_small(dir.path(), 64), None);
        assert!(open_regular(dir.path()).is_err());
        assert_eq!(read_small(&dir.path().join("missing"), 64), None);
        // A FIFO with no writer: a plain open would block for ever; this one refuses it.
        let fifo = dir.path().join("p");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(
            open_regular(&fifo).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(read_small(&fifo, 64), None);
    }
}
