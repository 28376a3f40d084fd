//! A lock directory shared by several users: its files take the directory's permissions.
//!
//! Each process creates the lock files it takes and the fencing counter `.fence` as its own
//! user, with the process's umask (usually `022`: writable by that user alone). In a directory
//! other users may write in (`chmod 1777`, as `/tmp` and `/run/lock`; or a group's directory,
//! `chgrp locks dir && chmod 2770 dir`, whose files inherit its group), every process must be
//! able to open every file for writing: the counter at every grant, a lock file left by a
//! killed holder of another user. So, when the directory grants write to its group or to
//! others, a file created there gets the directory's read and write bits (`1777` gives `0666`,
//! `2770` gives `0660`). A private directory (`0755`, `0700`) is left to the umask.
//!
//! A sticky directory (`1777`) lets only a file's owner remove it: a lock file of another user
//! is not removed at its release but blanked (`inspect::clear`) and left for the next holder.
//! A file made before (by an older version, or by hand) that this user cannot write is an
//! error naming the file, its owner and its mode.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// How the files of one lock directory are created.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sharing {
    /// The permission bits of files created in a shared directory; `None` in a private one.
    #[cfg_attr(not(unix), allow(dead_code))]
    mode: Option<u32>,
}

impl Sharing {
    /// Reads how `dir` (which exists) is shared.
    pub(super) fn of(dir: &Path) -> io::Result<Sharing> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let dir_mode = std::fs::metadata(dir)?.permissions().mode();
            let shared = dir_mode & 0o022 != 0;
            Ok(Sharing { mode: shared.then_some(dir_mode & 0o666) })
        }
        #[cfg(not(unix))]
        {
            let _ = dir;
            Ok(Sharing { mode: None })
        }
    }

    /// Opens `path` for reading and writing, creating it if it is missing (with the
    /// directory's permissions when it is shared).
    pub(super) fn open(&self, path: &Path) -> io::Result<File> {
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        if let Some(mode) = self.mode {
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        }
        let file = options.open(path).map_err(|e| denied(path, e))?;
        #[cfg(unix)]
        if let Some(mode) = self.mode {
            use std::os::unix::fs::PermissionsExt;
            // The umask took bits away from a file just created: give them back. (On a file of
            // another user this fails, and its creator gave them already.)
            if file.metadata()?.permissions().mode() & mode != mode {
                let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
            }
        }
        Ok(file)
    }
}

/// A refused opening, with who owns the file and how a shared directory is set up.
fn denied(path: &Path, e: io::Error) -> io::Error {
    if e.kind() != io::ErrorKind::PermissionDenied {
        return e;
    }
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::MetadataExt;
        return io::Error::new(
            e.kind(),
            format!(
                "{} is not writable by this user (owner uid {}, mode {:o}): in a lock directory shared by \
                 several users, files take the directory's permissions (chmod 1777, or a group's \
                 directory with chmod 2770); remove this file, or make it writable by the others ({e})",
                path.display(),
                meta.uid(),
                meta.mode() & 0o7777,
            ),
        );
    }
    io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display()))
}
