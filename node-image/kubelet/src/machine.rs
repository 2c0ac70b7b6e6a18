//! What the node registers about the machine it runs on (upstream cAdvisor's `MachineInfo`
//! and the kubelet's `nodestatus` setters): capacity from `/proc`, OS facts from `/etc` and
//! `/proc/sys`. Parsing is pure so it is tested on fixed text.

/// The machine's capacity and identity.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Machine {
    /// Logical CPUs.
    pub cpus: usize,
    /// MemTotal, in KiB.
    pub memory_kib: u64,
    /// `/etc/os-release` PRETTY_NAME.
    pub os_image: String,
    /// `uname -r`.
    pub kernel_version: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// `kubernetes.io/arch` (Go's GOARCH names).
    pub architecture: &'static str,
}

/// The MemTotal line of `/proc/meminfo`, in KiB.
pub fn parse_meminfo(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The number of `processor` entries of `/proc/cpuinfo`.
pub fn parse_cpuinfo(text: &str) -> usize {
    text.lines()
        .filter(|line| {
            line.split(':')
                .next()
                .is_some_and(|k| k.trim() == "processor")
        })
        .count()
}

/// PRETTY_NAME of an os-release file.
pub fn parse_os_release(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
}

/// Rust's architecture name as Kubernetes (GOARCH) spells it.
pub fn go_arch(arch: &str) -> &'static str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        _ => "unknown",
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// Reads this machine.
pub fn current() -> Machine {
    let cpus = match parse_cpuinfo(&read("/proc/cpuinfo")) {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    Machine {
        cpus,
        memory_kib: parse_meminfo(&read("/proc/meminfo")).unwrap_or(0),
        os_image: parse_os_release(&read("/etc/os-release")).unwrap_or_else(|| "Linux".into()),
        kernel_version: read("/proc/sys/kernel/osrelease"),
        machine_id: read("/etc/machine-id"),
        boot_id: read("/proc/sys/kernel/random/boot_id"),
        architecture: go_arch(std::env::consts::ARCH),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        let meminfo = "MemTotal:       24581112 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_meminfo(meminfo), Some(24_581_112));
        assert_eq!(parse_meminfo("MemFree: 1 kB"), None);
        let cpuinfo = "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\nflags\t: processor\n";
        assert_eq!(parse_cpuinfo(cpuinfo), 2);
        let os = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n";
        assert_eq!(
            parse_os_release(os).as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        let here = current();
        assert!(here.cpus >= 1 && here.memory_kib > 0);
    }
}
