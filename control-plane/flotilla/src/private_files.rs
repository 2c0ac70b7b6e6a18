//! Files only the service's user may read: the data directory (0700) and what is in it
//! (0600), files holding keys or tokens, and the key-encryption key file. Looser modes left
//! by earlier versions are tightened on start, with a warning.

use std::path::Path;

use anyhow::Context;
use flotilla_apiserver::storage::envelope::KeyEncryptionKey;

/// The data directory's mode: its owner only.
const PRIVATE_DIR_MODE: u32 = 0o700;
/// A private file's mode.
const PRIVATE_FILE_MODE: u32 = 0o600;
/// The KEK file `flotilla up` keeps in its data directory unless told otherwise.
pub(crate) const DATA_DIR_KEK: &str = "key-encryption-key";

/// Creates the data directory (0700) or tightens an existing one and every file directly in
/// it (0600); subdirectories are reachable only through it.
pub(crate) fn prepare_data_dir(dir: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(PRIVATE_DIR_MODE)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        tighten(dir, PRIVATE_DIR_MODE)?;
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                tighten(&entry.path(), PRIVATE_FILE_MODE)?;
            }
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(())
}

/// Makes `path` no more open than `mode` (group and others lose every bit the mode lacks).
#[cfg(unix)]
pub(crate) fn tighten(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let current = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode()
        & 0o777;
    if current & !mode != 0 {
        tracing::warn!(
            path = %path.display(),
            from = %format!("{current:o}"),
            to = %format!("{mode:o}"),
            "tightening a file other users could read"
        );
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("changing the mode of {}", path.display()))?;
    }
    Ok(())
}

/// Makes a file its owner's only (no-op off Unix).
pub(crate) fn make_private(path: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    tighten(path, PRIVATE_FILE_MODE)?;
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// Writes a file readable by its owner only (it holds a private key or a token); an existing
/// file keeps no looser mode.
pub(crate) fn write_private(path: &Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(PRIVATE_FILE_MODE);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    make_private(path)?;
    file.write_all(contents.as_ref())?;
    file.sync_all()?;
    Ok(())
}

/// The key-encryption key in `path`, created there (0600, with fresh random bytes) when the
/// file does not exist. Replicas racing to create it all end up with the one that won.
pub(crate) fn key_encryption_key(path: &Path) -> anyhow::Result<KeyEncryptionKey> {
    use std::io::Write;
    let text = match std::fs::read_to_string(path) {
        Ok(text) => {
            make_private(path)?;
            text
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            let text = KeyEncryptionKey::generate_file_text()?;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(PRIVATE_FILE_MODE);
            }
            match options.open(path) {
                Ok(mut file) => {
                    file.write_all(text.as_bytes())?;
                    file.sync_all()?;
                    tracing::info!(
                        path = %path.display(),
                        "created a new key-encryption key: private keys in the store are sealed under it; keep it (and give every replica the same file)"
                    );
                    text
                }
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                    std::fs::read_to_string(path)
                        .with_context(|| format!("reading {}", path.display()))?
                }
                Err(err) => {
                    return Err(err).with_context(|| format!("creating {}", path.display()));
                }
            }
        }
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    KeyEncryptionKey::from_file_text(&text)
        .with_context(|| format!("the key-encryption key file {}", path.display()))
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("meta").permissions().mode() & 0o777
    }

    #[test]
    fn an_open_data_dir_is_tightened_and_a_new_one_is_private() {
        let root = tempfile::tempdir().expect("dir");
        let fresh = root.path().join("a/b");
        prepare_data_dir(&fresh).expect("prepare");
        assert_eq!(mode(&fresh), 0o700);

        let old = root.path().join("old");
        std::fs::create_dir(&old).expect("dir");
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(old.join("store.redb"), b"x").expect("file");
        std::fs::set_permissions(
            old.join("store.redb"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        prepare_data_dir(&old).expect("prepare");
        assert_eq!(mode(&old), 0o700);
        assert_eq!(mode(&old.join("store.redb")), 0o600);
    }

    #[test]
    fn private_writes_leave_no_looser_mode() {
        let root = tempfile::tempdir().expect("dir");
        let path = root.path().join("kubeconfig");
        std::fs::write(&path, b"old").expect("file");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_private(&path, "new").expect("write");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
    }

    #[test]
    fn the_key_file_is_created_once_and_read_after() {
        let root = tempfile::tempdir().expect("dir");
        let path = root.path().join(DATA_DIR_KEK);
        let first = key_encryption_key(&path).expect("create");
        assert_eq!(mode(&path), 0o600);
        let again = key_encryption_key(&path).expect("read");
        assert_eq!(first.name(), again.name());
        std::fs::write(&path, "short").expect("file");
        let err = key_encryption_key(&path).expect_err("bad key");
        assert!(format!("{err:#}").contains("base64"), "{err:#}");
    }
}
