//! Upstream's AtomicWriter: an API-data volume's files live in a timestamped directory
//! (`..2026_12_03_21_40_00.123456789`); `..data` is a symlink to the current one and each
//! top-level name is a symlink through `..data`. An update writes a new directory and swaps
//! `..data` with one `rename`, so a container sees the old set or the new set, never a mix.
//! Nothing is written when the files are unchanged.

use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::plan::{self, DATA_DIR, Payload, PlanError};

/// Why a volume's files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The payload has a path that would escape the volume.
    #[error(transparent)]
    Payload(#[from] PlanError),
    /// A filesystem call failed.
    #[error("writing {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> WriteError + '_ {
    move |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `dir`'s current data equals `payload` (contents, modes and the set of paths).
fn unchanged(dir: &Path, payload: &Payload) -> bool {
    let data = dir.join(DATA_DIR);
    if std::fs::symlink_metadata(&data).is_err() {
        return false;
    }
    let mut existing = Vec::new();
    if collect_files(&data, Path::new(""), &mut existing).is_err() {
        return false;
    }
    if existing.len() != payload.len() {
        return false;
    }
    payload.iter().all(|(path, file)| {
        let full = data.join(path);
        let same_mode =
            std::fs::metadata(&full).is_ok_and(|m| m.permissions().mode() & 0o7777 == file.mode);
        same_mode && std::fs::read(&full).is_ok_and(|d| d == file.data)
    })
}

/// The relative paths of regular files under `dir` (following the `..data` link itself).
fn collect_files(dir: &Path, prefix: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let relative = prefix.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            collect_files(&entry.path(), &relative, out)?;
        } else {
            out.push(relative);
        }
    }
    Ok(())
}

/// A fresh timestamped directory name (upstream's `..` + `2006_01_02_15_04_05.` + suffix).
fn timestamped_name(dir: &Path) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    let base = format!(
        "..{}.{:09}",
        now.strftime("%Y_%m_%d_%H_%M_%S"),
        now.subsec_nanosecond()
    );
    let mut name = base.clone();
    let mut n = 0;
    while dir.join(&name).exists() {
        n += 1;
        name = format!("{base}{n}");
    }
    name
}

/// Projects `payload` into `dir` atomically; returns whether anything was written.
pub fn write(dir: &Path, payload: &Payload) -> Result<bool, WriteError> {
    let payload = plan::validate_payload(payload)?;
    std::fs::create_dir_all(dir).map_err(io_at(dir))?;
    if unchanged(dir, &payload) {
        return Ok(false);
    }
    let data_link = dir.join(DATA_DIR);
    let old = std::fs::read_link(&data_link).ok();
    let old_names: Vec<String> = match &old {
        Some(_) => {
            let mut files = Vec::new();
            let _ = collect_files(&data_link, Path::new(""), &mut files);
            let mut names: Vec<String> = files
                .iter()
                .filter_map(|p| p.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.dedup();
            names
        }
        None => Vec::new(),
    };
    // 1. The new data directory, complete before anyone can see it.
    let ts_name = timestamped_name(dir);
    let ts_dir = dir.join(&ts_name);
    std::fs::create_dir(&ts_dir).map_err(io_at(&ts_dir))?;
    std::fs::set_permissions(&ts_dir, std::fs::Permissions::from_mode(0o755))
        .map_err(io_at(&ts_dir))?;
    for (path, file) in &payload {
        let full = ts_dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(io_at(parent))?;
        }
        std::fs::write(&full, &file.data).map_err(io_at(&full))?;
        std::fs::set_permissions(&full, std::fs::Permissions::from_mode(file.mode))
            .map_err(io_at(&full))?;
    }
    // 2. Swap `..data` in one rename.
    let tmp_link = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp_link);
    symlink(&ts_name, &tmp_link).map_err(io_at(&tmp_link))?;
    std::fs::rename(&tmp_link, &data_link).map_err(io_at(&data_link))?;
    // 3. The user-visible names, through `..data`.
    let new_names = plan::top_level_names(&payload);
    for name in &new_names {
        let visible = dir.join(name);
        if std::fs::symlink_metadata(&visible).is_err() {
            symlink(Path::new(DATA_DIR).join(name), &visible).map_err(io_at(&visible))?;
        }
    }
    // 4. Names that are gone, then the old data directory.
    for name in old_names.iter().filter(|n| !new_names.contains(n)) {
        let visible = dir.join(name);
        let _ = std::fs::remove_file(&visible);
    }
    if let Some(old) = old {
        let old_dir = dir.join(old);
        if old_dir != ts_dir {
            let _ = std::fs::remove_dir_all(&old_dir);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::plan::FileProjection;

    fn file(text: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: text.as_bytes().to_vec(),
            mode,
        }
    }

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "flotilla-atomic-{name}-{}-{}",
            std::process::id(),
            k8s_openapi::jiff::Timestamp::now().as_nanosecond()
        ));
        std::fs::create_dir_all(&dir).expect("tempdir");
        dir
    }

    #[test]
    fn writes_swap_data_and_keep_only_current_names() {
        let dir = tempdir("swap");
        let first = Payload::from([
            ("a".to_string(), file("1", 0o644)),
            ("sub/b".to_string(), file("2", 0o600)),
        ]);
        assert!(write(&dir, &first).expect("first"));
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "1");
        assert_eq!(std::fs::read_to_string(dir.join("sub/b")).expect("b"), "2");
        let mode = std::fs::metadata(dir.join("sub/b"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            std::fs::read_link(dir.join("a")).expect("link"),
            Path::new("..data/a")
        );
        let first_target = std::fs::read_link(dir.join(DATA_DIR)).expect("data");
        assert!(first_target.to_string_lossy().starts_with("..20"));

        // The same payload writes nothing.
        assert!(!write(&dir, &first).expect("same"));
        assert_eq!(
            std::fs::read_link(dir.join(DATA_DIR)).expect("data"),
            first_target
        );

        // A change swaps the data directory, drops gone names and the old directory.
        let second = Payload::from([
            ("a".to_string(), file("1b", 0o644)),
            ("c".to_string(), file("3", 0o644)),
        ]);
        assert!(write(&dir, &second).expect("second"));
        assert_eq!(std::fs::read_to_string(dir.join("a")).expect("a"), "1b");
        assert_eq!(std::fs::read_to_string(dir.join("c")).expect("c"), "3");
        assert!(std::fs::symlink_metadata(dir.join("sub")).is_err());
        assert!(!dir.join(&first_target).exists());
        // A mode change alone is a change.
        let third = Payload::from([
            ("a".to_string(), file("1b", 0o400)),
            ("c".to_string(), file("3", 0o644)),
        ]);
        assert!(write(&dir, &third).expect("third"));
        let mut entries: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("..20"))
            .collect();
        entries.sort();
        assert_eq!(entries, ["..data", "a", "c"]);
        // An empty payload leaves an empty volume.
        assert!(write(&dir, &Payload::new()).expect("empty"));
        assert!(!dir.join("a").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn escaping_paths_are_refused() {
        let dir = tempdir("escape");
        let bad = Payload::from([("../x".to_string(), file("1", 0o644))]);
        assert!(matches!(write(&dir, &bad), Err(WriteError::Payload(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
