//! What the benchmarks read of a process from Linux `/proc`: CPU time used so far and resident
//! memory. Shared by the `tenancy` and `workloads` benches (`#[path]`-included).

use std::time::Duration;

use anyhow::Context;

/// CPU time (user + system) process `pid` ("self" for this one) has used so far; zero when
/// `/proc/PID/stat` cannot be read.
pub fn cpu(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // USER_HZ is 100 on Linux.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// Resident memory of process `pid`, in bytes.
pub fn rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context("no VmRSS in /proc/PID/status")?;
    Ok(kib * 1024)
}
