//! The plugin's unix socket: its path ([`SocketPath`], from `--listen`), binding it (a stale
//! socket file replaced, mode 0600 from the start, since whoever can connect can decrypt
//! every Secret) and removing it when the plugin stops ([`SocketFile`]).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rustix::fs::Mode;
use tokio::net::UnixListener;

/// The socket's mode: the API server (the same user) only.
pub const SOCKET_MODE: u32 = 0o600;

/// An absolute socket path, from `unix:///path` (the form the EncryptionConfiguration's
/// `endpoint` takes) or a bare `/path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketPath(PathBuf);

impl SocketPath {
    /// The path on disk.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl FromStr for SocketPath {
    type Err = String;

    fn from_str(listen: &str) -> Result<Self, Self::Err> {
        let path = listen.strip_prefix("unix://").unwrap_or(listen);
        if !path.starts_with('/') {
            return Err(format!(
                "{listen:?} is not unix:///absolute/path (e.g. unix:///run/flotilla/kms.sock)"
            ));
        }
        if path.ends_with('/') {
            return Err(format!("{listen:?} names a directory, not a socket"));
        }
        Ok(SocketPath(PathBuf::from(path)))
    }
}

impl std::fmt::Display for SocketPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unix://{}", self.0.display())
    }
}

/// Why the socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something that is not a socket is at the path: not ours to delete.
    #[error("{path} exists and is not a socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Another process answers on the socket.
    #[error("another process is serving {path}")]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// A filesystem call failed.
    #[error("{action} {path}")]
    Io {
        /// What was being done (`removing the stale socket`, `binding`, …).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SocketError {
    let path = path.to_path_buf();
    move |source| SocketError::Io {
        action,
        path,
        source,
    }
}

/// The bound socket's file, removed on drop unless another socket has replaced it since.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    /// (device, inode) of the file this process bound.
    identity: (u64, u64),
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|metadata| (metadata.dev(), metadata.ino()) == self.identity);
        if ours && let Err(err) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %err, "cannot remove the socket");
        }
    }
}

/// Binds `socket` (must run inside a tokio runtime): creates its directory if missing,
/// replaces a stale socket file (one nobody answers on), and creates the socket with mode
/// 0600.
pub fn bind(socket: &SocketPath) -> Result<(UnixListener, SocketFile), SocketError> {
    let path = socket.path();
    remove_stale(path)?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_error("creating the directory of", path))?;
    }
    // The umask applies when bind creates the file, so no process can connect between bind
    // and chmod. It is process-wide: nothing else creates files while the plugin starts.
    let previous = rustix::process::umask(Mode::from_raw_mode(0o777 & !SOCKET_MODE));
    let bound = UnixListener::bind(path);
    rustix::process::umask(previous);
    let listener = bound.map_err(io_error("binding", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(io_error("setting the mode of", path))?;
    let metadata = std::fs::symlink_metadata(path).map_err(io_error("inspecting", path))?;
    Ok((
        listener,
        SocketFile {
            path: path.to_path_buf(),
            identity: (metadata.dev(), metadata.ino()),
        },
    ))
}

/// Removes a socket file left by a plugin that did not stop cleanly.
fn remove_stale(path: &Path) -> Result<(), SocketError> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(io_error("inspecting", path)(err)),
    };
    if !metadata.file_type().is_socket() {
        return Err(SocketError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(SocketError::InUse {
            path: path.to_path_buf(),
        });
    }
    std::fs::remove_file(path).map_err(io_error("removing the stale socket", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_unix_urls_and_absolute_paths() {
        let parsed = |listen: &str| listen.parse::<SocketPath>().map(|s| s.0);
        assert_eq!(
            parsed("unix:///run/flotilla/kms.sock"),
            Ok(PathBuf::from("/run/flotilla/kms.sock"))
        );
        assert_eq!(parsed("/tmp/kms.sock"), Ok(PathBuf::from("/tmp/kms.sock")));
        assert!(parsed("unix://relative.sock").is_err());
        assert!(parsed("kms.sock").is_err());
        assert!(parsed("tcp://127.0.0.1:1").is_err());
        assert!(parsed("unix:///run/").is_err());
        let shown = "unix:///run/kms.sock"
            .parse::<SocketPath>()
            .map(|s| s.to_string());
        assert_eq!(shown.ok().as_deref(), Some("unix:///run/kms.sock"));
    }

    #[tokio::test]
    async fn binding_replaces_a_stale_socket_refuses_a_live_one_and_cleans_up()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let socket: SocketPath = format!("unix://{}/sub/kms.sock", dir.path().display()).parse()?;
        // A stale socket: bound, then its listener closed without removing the file.
        std::fs::create_dir_all(dir.path().join("sub"))?;
        drop(std::os::unix::net::UnixListener::bind(socket.path())?);
        assert!(socket.path().exists());

        let (listener, file) = bind(&socket)?;
        let mode = std::fs::metadata(socket.path())?.permissions().mode();
        assert_eq!(mode & 0o777, SOCKET_MODE);
        assert!(matches!(bind(&socket), Err(SocketError::InUse { .. })));

        drop(listener);
        drop(file);
        assert!(!socket.path().exists());
        Ok(())
    }

    #[test]
    fn binding_never_deletes_a_file_that_is_not_a_socket() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("kms.sock");
        std::fs::write(&path, "not a socket")?;
        let socket: SocketPath = path.display().to_string().parse()?;
        assert!(matches!(bind(&socket), Err(SocketError::NotASocket { .. })));
        assert!(path.exists());
        Ok(())
    }
}
