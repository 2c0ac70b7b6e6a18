//! The fault suite's disks: a tmpfs the embedded store's variant can fill, and for each etcd
//! member an ext4 file system on a loop device of its own, which can be filled and, through
//! the block I/O controller's throttle on that device for the member's cgroup, made slow —
//! every `fdatasync` of its WAL then waits for the device's few writes a second (cgroup v1's
//! `blkio` throttle).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use super::topology::run;

/// A small tmpfs mounted on a directory: a disk the suite can fill.
pub struct Tmpfs {
    pub path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`256m`) on `path` (created if needed).
    pub fn mount(path: &Path, size: &str) -> anyhow::Result<Tmpfs> {
        std::fs::create_dir_all(path)?;
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                &path.to_string_lossy(),
            ],
        )?;
        Ok(Tmpfs {
            path: path.to_path_buf(),
        })
    }

    pub fn fill(&self) -> anyhow::Result<()> {
        fill(&self.path)
    }

    pub fn free(&self) -> anyhow::Result<()> {
        free(&self.path)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Fills the file system under `dir`: a file takes every byte left, so the next write fails
/// `ENOSPC`.
fn fill(dir: &Path) -> anyhow::Result<()> {
    // dd stops with "No space left on device", which is the point.
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", filler(dir).display()))
        .stderr(Stdio::null())
        .status()?;
    Ok(())
}

/// Frees what [`fill`] took.
fn free(dir: &Path) -> anyhow::Result<()> {
    std::fs::remove_file(filler(dir)).context("removing the filler")
}

fn filler(dir: &Path) -> PathBuf {
    dir.join("fault-suite-filler")
}

/// Where cgroup v1's block I/O controller is mounted (this project's machines run cgroup v1).
const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// An ext4 file system on a loop device, mounted on a directory, with a cgroup whose
/// processes' writes to the device can be throttled.
pub struct LoopDisk {
    pub path: PathBuf,
    image: PathBuf,
    device: String,
    /// The device's `MAJOR:MINOR`.
    number: String,
    cgroup: PathBuf,
}

impl LoopDisk {
    /// Makes a `megabytes` file system backed by a sparse file beside `path`, mounts it on
    /// `path`, and a cgroup named after it.
    pub fn mount(path: &Path, megabytes: u64) -> anyhow::Result<LoopDisk> {
        if !Path::new(BLKIO)
            .join("blkio.throttle.write_iops_device")
            .exists()
        {
            bail!(
                "the slow-disk nemesis throttles a device per cgroup: this machine has no cgroup \
                 v1 blkio controller at {BLKIO}"
            );
        }
        std::fs::create_dir_all(path)?;
        let image = path.with_extension("img");
        std::fs::File::create(&image)?.set_len(megabytes << 20)?;
        let device = run("losetup", &["--find", "--show", &image.to_string_lossy()])?
            .trim()
            .to_string();
        let number = run(
            "lsblk",
            &["--nodeps", "--noheadings", "-o", "MAJ:MIN", &device],
        )?
        .trim()
        .to_string();
        let name = format!(
            "flotilla-faults-{}",
            device.trim_start_matches("/dev/").replace('/', "-")
        );
        let disk = LoopDisk {
            path: path.to_path_buf(),
            image,
            device,
            number,
            cgroup: Path::new(BLKIO).join(name),
        };
        // No blocks reserved for root: etcd runs as root and must meet ENOSPC when full.
        run("mkfs.ext4", &["-q", "-m", "0", &disk.device])?;
        run("mount", &[&disk.device, &path.to_string_lossy()])?;
        std::fs::create_dir_all(&disk.cgroup).context("making the member's cgroup")?;
        Ok(disk)
    }

    /// Puts process `pid` (all its threads) in the disk's cgroup.
    pub fn adopt(&self, pid: u32) -> anyhow::Result<()> {
        std::fs::write(self.cgroup.join("cgroup.procs"), pid.to_string())
            .context("moving the process into its disk's cgroup")
    }

    /// Lets the cgroup's processes write to the device `iops` times a second (0: unlimited).
    pub fn throttle(&self, iops: u32) -> anyhow::Result<()> {
        std::fs::write(
            self.cgroup.join("blkio.throttle.write_iops_device"),
            format!("{} {iops}", self.number),
        )
        .context("setting the write throttle")
    }

    pub fn fill(&self) -> anyhow::Result<()> {
        fill(&self.path)
    }

    pub fn free(&self) -> anyhow::Result<()> {
        free(&self.path)
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = self.throttle(0);
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = std::fs::remove_file(&self.image);
    }
}
