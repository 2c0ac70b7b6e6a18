//! The log backend: one JSON line per event, appended to a file (mode 0600) that is rotated
//! by size with lumberjack's naming and retention, as upstream's `--audit-log-*` flags do.
//! A thread of its own writes; requests wait only when it is a whole buffer behind.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::mpsc;

/// Where and how the log is kept (upstream's `--audit-log-path`, `-maxsize`, `-maxbackup`,
/// `-maxage`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogOptions {
    /// The file; `-` writes to standard output.
    pub path: PathBuf,
    /// Megabytes a file reaches before it is rotated; 0 is lumberjack's default of 100.
    pub max_size_mb: u64,
    /// Rotated files kept; 0 keeps all (that `max_age_days` allows).
    pub max_backups: usize,
    /// Days a rotated file is kept; 0 keeps them whatever their age.
    pub max_age_days: u64,
}

/// Events written ahead of the file before a request waits for the writer.
const BUFFERED_EVENTS: usize = 4096;

/// lumberjack's timestamp in rotated files' names (Go's `2006-01-02T15-04-05.000`, UTC).
const BACKUP_TIME_FORMAT: &str = "%Y-%m-%dT%H-%M-%S%.3f";

/// A running log backend.
#[derive(Debug, Clone)]
pub struct LogBackend {
    lines: mpsc::Sender<Bytes>,
}

impl LogBackend {
    /// Opens (creating it 0600) the file and starts the writer.
    pub fn start(options: LogOptions) -> std::io::Result<LogBackend> {
        let mut writer = RotatingFile::open(options)?;
        let (lines, mut received) = mpsc::channel::<Bytes>(BUFFERED_EVENTS);
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                while let Some(line) = received.blocking_recv() {
                    let mut result = writer.write_line(&line);
                    // Everything already queued goes out in the same buffered write.
                    while result.is_ok()
                        && let Ok(line) = received.try_recv()
                    {
                        result = writer.write_line(&line);
                    }
                    if let Err(err) = result.and_then(|()| writer.flush()) {
                        tracing::error!(%err, "writing the audit log failed; events were lost");
                    }
                }
            })?;
        Ok(LogBackend { lines })
    }

    /// Queues one encoded event (a line ending in `\n`); waits while the writer is a whole
    /// buffer behind, as upstream's blocking mode makes the request wait.
    pub async fn send(&self, line: Bytes) {
        if self.lines.send(line).await.is_err() {
            tracing::error!("the audit log writer stopped; an event was lost");
        }
    }
}

/// The file being written, rotated by size.
struct RotatingFile {
    options: LogOptions,
    file: Option<BufWriter<File>>,
    size: u64,
}

impl RotatingFile {
    fn open(options: LogOptions) -> std::io::Result<RotatingFile> {
        let mut rotating = RotatingFile {
            options,
            file: None,
            size: 0,
        };
        if !rotating.to_stdout() {
            rotating.open_existing()?;
        }
        Ok(rotating)
    }

    fn to_stdout(&self) -> bool {
        self.options.path == Path::new("-")
    }

    fn max_bytes(&self) -> u64 {
        let mb = if self.options.max_size_mb == 0 {
            100
        } else {
            self.options.max_size_mb
        };
        mb * 1024 * 1024
    }

    fn open_existing(&mut self) -> std::io::Result<()> {
        if let Some(parent) = self.options.path.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)?;
        }
        let file = private_append(&self.options.path)?;
        self.size = file.metadata()?.len();
        self.file = Some(BufWriter::with_capacity(64 * 1024, file));
        Ok(())
    }

    fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.to_stdout() {
            return std::io::stdout().lock().write_all(line);
        }
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes() {
            self.rotate()?;
        }
        let file = match self.file.as_mut() {
            Some(file) => file,
            None => {
                self.open_existing()?;
                self.file
                    .as_mut()
                    .ok_or_else(|| std::io::Error::other("no log file"))?
            }
        };
        file.write_all(line)?;
        self.size += line.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.to_stdout() {
            return std::io::stdout().flush();
        }
        match self.file.as_mut() {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }

    /// Renames the file to `<name>-<time><ext>`, starts an empty one and removes the rotated
    /// files retention no longer keeps.
    fn rotate(&mut self) -> std::io::Result<()> {
        if let Some(mut file) = self.file.take() {
            file.flush()?;
        }
        let path = self.options.path.clone();
        let stamp = chrono::Utc::now().format(BACKUP_TIME_FORMAT).to_string();
        std::fs::rename(&path, backup_name(&path, &stamp))?;
        self.open_existing()?;
        remove_expired(&path, &self.options)
    }
}

fn private_append(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// `dir/audit.log` rotated at `stamp` is `dir/audit-<stamp>.log` (lumberjack's name).
fn backup_name(path: &Path, stamp: &str) -> PathBuf {
    let (prefix, ext) = name_parts(path);
    path.with_file_name(format!("{prefix}-{stamp}{ext}"))
}

/// A file name's stem and extension, split as Go's `filepath.Ext` splits it.
fn name_parts(path: &Path) -> (String, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.rfind('.') {
        Some(dot) => (name[..dot].to_string(), name[dot..].to_string()),
        None => (name, String::new()),
    }
}

/// The rotated files of `path`, newest first, with the time in their names.
fn backups(path: &Path) -> std::io::Result<Vec<(chrono::NaiveDateTime, PathBuf)>> {
    let (prefix, ext) = name_parts(path);
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stamp) = name
            .strip_prefix(&format!("{prefix}-"))
            .and_then(|rest| rest.strip_suffix(ext.as_str()))
        else {
            continue;
        };
        if let Ok(at) = chrono::NaiveDateTime::parse_from_str(stamp, BACKUP_TIME_FORMAT) {
            found.push((at, entry.path()));
        }
    }
    found.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
    Ok(found)
}

/// lumberjack's `millRunOnce` without compression: beyond `max_backups`, or older than
/// `max_age_days`, a rotated file goes.
fn remove_expired(path: &Path, options: &LogOptions) -> std::io::Result<()> {
    let found = backups(path)?;
    let cutoff = (options.max_age_days > 0).then(|| {
        let age = Duration::from_secs(options.max_age_days * 24 * 3600);
        chrono::DateTime::<chrono::Utc>::from(SystemTime::now() - age).naive_utc()
    });
    for (i, (at, file)) in found.iter().enumerate() {
        let too_many = options.max_backups > 0 && i >= options.max_backups;
        let too_old = cutoff.is_some_and(|cutoff| *at < cutoff);
        if too_many || too_old {
            std::fs::remove_file(file)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn rotated_names_are_lumberjacks() {
        assert_eq!(
            backup_name(Path::new("/var/log/audit.log"), "2026-12-06T10-00-00.123"),
            PathBuf::from("/var/log/audit-2026-12-06T10-00-00.123.log")
        );
        assert_eq!(
            backup_name(Path::new("audit"), "2026-12-06T10-00-00.123"),
            PathBuf::from("audit-2026-12-06T10-00-00.123")
        );
    }

    #[test]
    fn a_full_file_rotates_and_only_max_backups_are_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.log");
        let mut file = RotatingFile::open(LogOptions {
            path: path.clone(),
            max_size_mb: 1,
            max_backups: 2,
            max_age_days: 0,
        })
        .expect("opens");
        let line = vec![b'x'; 300 * 1024];
        for _ in 0..14 {
            file.write_line(&line).expect("writes");
            // Rotated names carry milliseconds: keep them apart.
            std::thread::sleep(Duration::from_millis(2));
        }
        file.flush().expect("flushes");
        let kept = backups(&path).expect("lists");
        assert_eq!(kept.len(), 2, "{kept:?}");
        // 14 lines of 300 KiB, three to a 1 MiB file: the current file holds the last two.
        assert_eq!(
            std::fs::metadata(&path).expect("exists").len(),
            2 * 300 * 1024
        );
        let mode = std::fs::metadata(&path)
            .expect("exists")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn old_backups_expire_by_age() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.log");
        std::fs::write(dir.path().join("audit-2020-01-01T00-00-00.000.log"), b"old").expect("w");
        let recent = chrono::Utc::now().format(BACKUP_TIME_FORMAT).to_string();
        std::fs::write(backup_name(&path, &recent), b"new").expect("w");
        std::fs::write(dir.path().join("audit-notatime.log"), b"other").expect("w");
        let options = LogOptions {
            path: path.clone(),
            max_size_mb: 0,
            max_backups: 0,
            max_age_days: 30,
        };
        remove_expired(&path, &options).expect("removes");
        let left = backups(&path).expect("lists");
        assert_eq!(left.len(), 1);
        assert!(dir.path().join("audit-notatime.log").exists());
    }
}
