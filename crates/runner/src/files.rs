//! Reading files that an agent could have replaced: in its `HOME` (Codex's session files),
//! its worktree (`.git`) or its run directory (`agent.pid`). The service reads them with
//! its own rights and often on the async runtime, so a symbolic link must not lead it to a
//! file of the service's, a FIFO must not block it, and a file that keeps growing must not
//! be read whole.
//!
//! Where the agent can also replace the directories on the way to a file (Codex's session
//! directories in its `HOME`), [`OpenDir`] and [`open_regular_beneath`] open every
//! directory below a root relative to the one above it, with `O_NOFOLLOW | O_DIRECTORY`:
//! a directory swapped for a link, before or while it is listed or read, is refused, and
//! one swapped after it was opened is no longer the one read from (the descriptor is).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path};

use nix::dir::{Dir, Type};
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};

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

/// The flags of a directory opened below a root: read-only, never through a symbolic link,
/// a directory only, not inherited by the processes the service starts.
const DIR_BENEATH: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// The names of the components of `relative`, each a plain name (no `..`, `.` or root).
fn plain_names(relative: &Path) -> io::Result<Vec<&OsStr>> {
    relative
        .components()
        .map(|component| match component {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a plain relative path", relative.display()),
            )),
        })
        .collect()
}

/// Opens the directory `relative` below `root` (`root` itself is followed: it is a path the
/// service made), each level opened in the one above without following a symbolic link.
fn open_dir_fd_beneath(root: &Path, relative: &Path) -> io::Result<OwnedFd> {
    let mut dir = nix::fcntl::open(
        root,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    for name in plain_names(relative)? {
        dir = nix::fcntl::openat(&dir, name, DIR_BENEATH, Mode::empty())?;
    }
    Ok(dir)
}

/// What a directory entry is, the entry itself (a symbolic link is [`EntryKind::Other`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum EntryKind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// Anything else: a symbolic link, a FIFO, a device, a socket, or unknown.
    Other,
}

/// A directory below a root, opened without following a symbolic link at any level below
/// that root; what is listed and opened in it is relative to its descriptor, not its path.
#[derive(Debug)]
pub(crate) struct OpenDir(Dir);

impl OpenDir {
    /// Opens the directory `relative` (plain names only) below `root`: `root` as it is,
    /// each directory below it with `O_NOFOLLOW | O_DIRECTORY` in the one above.
    ///
    /// # Errors
    ///
    /// A level is missing, not a directory, a symbolic link, or cannot be opened.
    pub(crate) fn open(root: &Path, relative: &Path) -> io::Result<Self> {
        Ok(OpenDir(Dir::from_fd(open_dir_fd_beneath(root, relative)?)?))
    }

    /// Opens the directory `name` in this one, not through a symbolic link.
    ///
    /// # Errors
    ///
    /// `name` is not a plain name, is missing, not a directory, a symbolic link, or cannot
    /// be opened.
    pub(crate) fn subdir(&self, name: &OsStr) -> io::Result<Self> {
        plain_names(Path::new(name))?;
        let fd = nix::fcntl::openat(&self.0, name, DIR_BENEATH, Mode::empty())?;
        Ok(OpenDir(Dir::from_fd(fd)?))
    }

    /// At most `max` entries of this directory (not `.` and `..`), in the order the file
    /// system lists them, each with its kind (the entry's own, a link not followed). A
    /// listing that fails midway gives the entries read so far.
    pub(crate) fn entries(&mut self, max: usize) -> Vec<(OsString, EntryKind)> {
        let mut names = Vec::new();
        for entry in self.0.iter() {
            if names.len() >= max {
                break;
            }
            let Ok(entry) = entry else {
                break;
            };
            let name = entry.file_name();
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            names.push((
                OsStr::from_bytes(name.to_bytes()).to_owned(),
                entry.file_type(),
            ));
        }
        names
            .into_iter()
            .map(|(name, kind)| {
                let kind = match kind {
                    Some(Type::Directory) => EntryKind::Dir,
                    Some(Type::File) => EntryKind::File,
                    Some(_) => EntryKind::Other,
                    // The file system does not say: ask it, about the entry itself.
                    None => match nix::sys::stat::fstatat(
                        &self.0,
                        name.as_os_str(),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    ) {
                        Ok(stat) => match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
                            SFlag::S_IFDIR => EntryKind::Dir,
                            SFlag::S_IFREG => EntryKind::File,
                            _ => EntryKind::Other,
                        },
                        Err(_) => EntryKind::Other,
                    },
                };
                (name, kind)
            })
            .collect()
    }
}

/// Opens the regular file `relative` below `root` as [`open_regular`] does, and without
/// following a symbolic link at any directory level below `root` either: each directory is
/// opened in the one above it with `O_NOFOLLOW | O_DIRECTORY`, the file in the last one.
///
/// # Errors
///
/// `relative` is not plain names, a level is missing, a symbolic link or not a directory,
/// or the file cannot be opened or is not a regular file.
pub(crate) fn open_regular_beneath(root: &Path, relative: &Path) -> io::Result<File> {
    let (Some(parent), Some(name)) = (relative.parent(), relative.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", relative.display()),
        ));
    };
    let dir = open_dir_fd_beneath(root, parent)?;
    let fd = nix::fcntl::openat(
        &dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let file = File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", relative.display()),
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

    /// Below the root, a symbolic link is refused at every level, the file's and every
    /// directory's; the root itself, and plain directories, are followed.
    #[test]
    fn beneath_a_root_no_level_is_a_link() {
        let root = tempfile::TempDir::new().unwrap();
        let outside = tempfile::TempDir::new().unwrap();
        std::fs::create_dir_all(outside.path().join("b")).unwrap();
        std::fs::write(outside.path().join("b/f"), "theirs").unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::fs::write(root.path().join("a/b/f"), "mine").unwrap();
        let read = |relative: &str| {
            let mut text = String::new();
            open_regular_beneath(root.path(), Path::new(relative))
                .and_then(|mut f| f.read_to_string(&mut text))
                .map(|_| text)
        };
        assert_eq!(read("a/b/f").unwrap(), "mine");
        assert!(OpenDir::open(root.path(), Path::new("a/b")).is_ok());
        assert!(read("a/../a/b/f").is_err());
        assert!(read("/etc/passwd").is_err());

        // A directory level swapped for a link to a directory outside.
        std::fs::rename(root.path().join("a"), root.path().join("real")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("a")).unwrap();
        assert!(read("a/b/f").is_err());
        assert!(OpenDir::open(root.path(), Path::new("a")).is_err());
        assert!(OpenDir::open(root.path(), Path::new("a/b")).is_err());
        // The file a link.
        std::os::unix::fs::symlink(outside.path().join("b/f"), root.path().join("real/b/g"))
            .unwrap();
        assert!(read("real/b/g").is_err());
        // Listing sees the entries themselves, a link as a link.
        let mut dir = OpenDir::open(root.path(), Path::new("")).unwrap();
        let mut entries = dir.entries(10);
        entries.sort();
        assert_eq!(
            entries,
            [
                (OsString::from("a"), EntryKind::Other),
                (OsString::from("real"), EntryKind::Dir)
            ]
        );
        assert!(dir.subdir(OsStr::new("a")).is_err());
        let mut real = dir.subdir(OsStr::new("real")).unwrap();
        assert_eq!(real.entries(10), [(OsString::from("b"), EntryKind::Dir)]);
        assert_eq!(dir.entries(1).len(), 1);
        // Through a link as the root itself: followed (it is the service's own path).
        let via = outside.path().join("root-link");
        std::os::unix::fs::symlink(root.path(), &via).unwrap();
        assert!(OpenDir::open(&via, Path::new("real/b")).is_ok());
    }
}
