//! Where a lock lives on disk: the file name of a key (escaped, so that any name stays inside
//! the directory; hashed when long), whether two handles name the same file, and whether the
//! directory is on a network file system.

use std::fs::File;
use std::io;
use std::path::Path;

/// The suffix of every lock file; nothing else in the directory ends with it.
pub(super) const SUFFIX: &str = ".lock";
/// Escaped names longer than this are cut and followed by a hash of the whole key (file names
/// are limited to 255 bytes).
const MAX_ESCAPED: usize = 180;

/// The lock file name of `key`: ASCII letters, digits, `-` and `_` as they are, `.` except in
/// front; every other byte as `%XX`, so no name can reach outside the directory (`../x` is
/// `%2E.%2Fx.lock`). A name longer than 180 escaped bytes keeps its first 150 and adds 32 hex
/// digits of a fixed 128-bit hash (FNV-1a, the same in every process and build): two long
/// names that share a file are false contention, never two holders.
///
/// ```
/// use lock_runtime::backend::file::file_name;
///
/// assert_eq!(file_name("orders:42"), "orders%3A42.lock");
/// assert_eq!(file_name("../etc/passwd"), "%2E.%2Fetc%2Fpasswd.lock");
/// assert!(file_name(&"x".repeat(1000)).len() < 255);
/// ```
pub fn file_name(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + SUFFIX.len());
    for (i, b) in key.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => out.push(b as char),
            b'.' if i > 0 => out.push('.'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    if out.len() > MAX_ESCAPED {
        let mut cut = 150;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        let (a, b) = (fnv1a(key.as_bytes(), 0xcbf2_9ce4_8422_2325), fnv1a(key.as_bytes(), 0x6c62_272e_07bb_0142));
        out.push_str(&format!("~{a:016x}{b:016x}"));
    }
    if out.is_empty() {
        out.push('%'); // no escape is a lone `%`: an empty key has a file of its own
    }
    out.push_str(SUFFIX);
    out
}

/// The key a lock file name was escaped from ([`file_name`] undone); a hashed long name comes
/// back as it is, without its suffix.
pub(super) fn unescape_name(name: &str) -> String {
    let name = name.strip_suffix(SUFFIX).unwrap_or(name);
    if name.contains('~') || name == "%" {
        return name.to_owned();
    }
    let mut bytes = Vec::with_capacity(name.len());
    let mut rest = name.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        match (b, tail.get(..2).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok()))
        {
            (b'%', Some(byte)) => {
                bytes.push(byte);
                rest = &tail[2..];
            }
            _ => {
                bytes.push(b);
                rest = tail;
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// 64-bit FNV-1a from `basis`.
fn fnv1a(bytes: &[u8], basis: u64) -> u64 {
    bytes.iter().fold(basis, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Whether `path` names the file `file` is open on now (`false` once it was removed or
/// replaced). A holder checks it after its lock is granted: a release removes the file while
/// still holding its lock, so a lock granted on a removed file holds nothing.
#[cfg(unix)]
pub(super) fn names(path: &Path, file: &File) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let open = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(now) => Ok(now.dev() == open.dev() && now.ino() == open.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Lock files are never removed where a file cannot be replaced while open: the name always
/// names the same file.
#[cfg(not(unix))]
pub(super) fn names(_path: &Path, _file: &File) -> io::Result<bool> {
    Ok(true)
}

/// The file system type of `dir` when it is one whose advisory locks do not hold across hosts
/// (NFS, SMB/CIFS, 9p, sshfs, AFS): read from `/proc/self/mountinfo` (Linux; `None` elsewhere
/// or when unknown).
pub(super) fn network_file_system(dir: &Path) -> Option<String> {
    let dir = dir.canonicalize().ok()?;
    network_type(&std::fs::read_to_string("/proc/self/mountinfo").ok()?, &dir)
}

/// The network file system type of the mount `dir` (canonical) is on, from `mountinfo`'s text.
fn network_type(mounts: &str, dir: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let (before, after) = line.split_once(" - ")?;
        let mount_point = unescape(before.split(' ').nth(4)?);
        let fs_type = after.split(' ').next()?;
        if dir.starts_with(&mount_point) && best.as_ref().is_none_or(|(len, _)| mount_point.len() >= *len) {
            best = Some((mount_point.len(), fs_type.to_owned()));
        }
    }
    let (_, fs_type) = best?;
    let network = ["nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "afs", "ncpfs"];
    network.contains(&fs_type.as_str()).then_some(fs_type)
}

/// `/proc/self/mountinfo` writes a space, tab, newline and backslash in a path as `\ooo`.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_maps_to_a_plain_file_name_in_the_directory() {
        for key in ["", ".", "..", "../x", "a/b", "/abs", "x\0y", "ünï", "%2E", "a.b", ".hidden", "con"] {
            let name = file_name(key);
            assert!(!name.starts_with('.'), "{key:?} -> {name}");
            assert!(!name.contains('/') && !name.contains('\0') && !name.contains('\\'), "{key:?} -> {name}");
            assert!(name.ends_with(SUFFIX), "{key:?} -> {name}");
        }
        assert_ne!(file_name("%2E"), file_name("."), "the escape character is escaped too");
        assert_ne!(file_name("a:b"), file_name("a_b"));
    }

    #[test]
    fn escaped_names_read_back() {
        for key in ["orders:42", "../x", "ünï/ß", "a.b", "%2E"] {
            assert_eq!(unescape_name(&file_name(key)), key);
        }
    }

    #[test]
    fn long_names_are_cut_and_hashed_distinctly() {
        let (a, b) = (format!("{}a", "x".repeat(300)), format!("{}b", "x".repeat(300)));
        let (fa, fb) = (file_name(&a), file_name(&b));
        assert_ne!(fa, fb);
        assert!(fa.len() <= 200, "{}", fa.len());
        assert_eq!(fa, file_name(&a), "stable");
        let multibyte = "é".repeat(200);
        assert!(file_name(&multibyte).len() <= 200);
    }

    #[test]
    fn network_file_systems_are_told_by_the_deepest_mount() {
        let mounts = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n\
                      40 22 0:50 / /mnt/shared rw - nfs4 server:/export rw,vers=4.2\n\
                      41 40 0:51 / /mnt/shared/local rw - tmpfs tmpfs rw\n\
                      42 22 0:52 / /mnt/with\\040space rw - cifs //host/share rw\n";
        let at = |p: &str| network_type(mounts, Path::new(p));
        assert_eq!(at("/var/lock/app"), None);
        assert_eq!(at("/mnt/shared/app").as_deref(), Some("nfs4"));
        assert_eq!(at("/mnt/shared/local/app"), None, "a local mount inside the NFS one");
        assert_eq!(at("/mnt/sharedx"), None, "a path prefix is not a parent");
        assert_eq!(at("/mnt/with space/x").as_deref(), Some("cifs"));
    }

    #[test]
    fn mountinfo_escapes_are_read() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/odd\x"), r"/odd\x");
    }
}
