//! Virtual machines booted from the node image (`node-image/image/build`) under qemu's software
//! emulation (no KVM on these machines), as EC2 boots an AMI: each VM is a peer of the
//! namespace nodes on a fabric (a tap on the fabric's bridge), leases its address by DHCP from
//! the fabric's dnsmasq (MAC → address, as EC2 leases an ENI's private address), reads its
//! instance metadata at 169.254.169.254 (the host DNATs that to an IMDSv2 emulator, which
//! answers by the guest's address) and writes its console to a file (`GetConsoleOutput`'s).
//! Everything is stopped and removed when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail, ensure};

use crate::Process;
use crate::imds::ImdsEmulator;
use crate::nodes::Fabric;

/// Where `node-image/image/build` leaves the newest image unless `--out` says otherwise.
const DEFAULT_IMAGE: &str = "/var/cache/flotilla-node-image/flotilla-node.qcow2";

/// The node image to boot: `FLOTILLA_NODE_IMAGE`, else the build's default output; fails
/// saying how to build it when neither exists.
pub fn node_image() -> anyhow::Result<PathBuf> {
    let image = std::env::var_os("FLOTILLA_NODE_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_IMAGE));
    ensure!(
        image.exists(),
        "no node image at {} (build it with node-image/image/build, as root; tests/run does; \
         or set FLOTILLA_NODE_IMAGE)",
        image.display()
    );
    Ok(image)
}

/// Fails, naming what is missing, unless this machine can boot node images.
pub fn require_qemu() -> anyhow::Result<()> {
    crate::nodes::require_runtime()?;
    let missing: Vec<&str> = ["qemu-system-x86_64", "qemu-img", "dnsmasq"]
        .into_iter()
        .filter(|tool| !crate::nodes::on_path(tool))
        .collect();
    if !missing.is_empty() {
        bail!(
            "booting node images needs {} (apt-get install -y qemu-system-x86 qemu-utils \
             dnsmasq-base; tests/run installs them)",
            missing.join(", ")
        );
    }
    Ok(())
}

fn run(command: &mut Command) -> anyhow::Result<String> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn in_netns(netns: &str, program: &str) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", netns, program]);
    command
}

/// What VMs on one fabric share: its DHCP server and the host's route to their metadata.
pub struct VmNetwork {
    _dnsmasq: Process,
    netns: String,
    prefix: String,
    hosts: PathBuf,
    nft_table: String,
    dir: PathBuf,
}

impl VmNetwork {
    /// Serves DHCP on `fabric`'s bridge and sends the guests' `169.254.169.254:80` to `imds`.
    /// The lease's routes (option 121, as a VPC route table) are `routes` (`(cidr, via)`:
    /// other nodes' pods through their nodes) and a default route through the host.
    pub fn start(
        fabric: &Fabric,
        imds: &ImdsEmulator,
        routes: &[(String, String)],
        dir: &Path,
    ) -> anyhow::Result<Self> {
        require_qemu()?;
        let read = |name: &str| -> anyhow::Result<String> {
            Ok(std::fs::read_to_string(fabric.dir().join(name))
                .with_context(|| format!("the fabric's {name}"))?
                .trim()
                .to_string())
        };
        let (netns, prefix, host_if) = (read("netns")?, read("prefix")?, read("host-if")?);
        let hosts = dir.join("dhcp-hosts");
        std::fs::create_dir_all(&hosts)?;
        run(in_netns(&netns, "ip").args([
            "addr",
            "replace",
            &format!("{prefix}.254/24"),
            "dev",
            "fab0",
        ]))?;
        let log = std::fs::File::create(dir.join("dnsmasq.log"))?;
        let child = in_netns(&netns, "dnsmasq")
            .args([
                "--keep-in-foreground",
                "--port=0",
                "--interface=fab0",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                "--user=root",
                "--log-dhcp",
                "--log-facility=-",
            ])
            .arg(format!("--dhcp-range={prefix}.0,static,255.255.255.0,12h"))
            .arg(format!(
                "--dhcp-option=121,{}0.0.0.0/0,{prefix}.1",
                routes
                    .iter()
                    .map(|(cidr, via)| format!("{cidr},{via},"))
                    .collect::<String>()
            ))
            .arg(format!("--dhcp-hostsdir={}", hosts.display()))
            .arg(format!("--dhcp-leasefile={}", dir.join("leases").display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting dnsmasq")?;
        let dnsmasq = Process { child };
        let nft_table = format!("flotilla-imds-{}", host_if.trim_start_matches("flh"));
        let rules = format!(
            "table ip {nft_table} {{\n  chain prerouting {{\n    type nat hook prerouting priority dstnat; policy accept;\n    iifname \"{host_if}\" ip daddr 169.254.169.254 tcp dport 80 dnat to {}\n  }}\n}}\n",
            imds.address()
        );
        let mut nft = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running nft")?;
        if let Some(stdin) = nft.stdin.as_mut() {
            std::io::Write::write_all(stdin, rules.as_bytes())?;
        }
        drop(nft.stdin.take());
        let out = nft.wait_with_output()?;
        ensure!(
            out.status.success(),
            "nft: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(VmNetwork {
            _dnsmasq: dnsmasq,
            netns,
            prefix,
            hosts,
            nft_table,
            dir: dir.to_path_buf(),
        })
    }

    /// dnsmasq's log (the leases it gave).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dnsmasq.log")).unwrap_or_default()
    }
}

impl Drop for VmNetwork {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "ip", &self.nft_table])
            .status();
    }
}

/// A tap on a fabric's bridge, removed when dropped.
struct Tap {
    netns: String,
    name: String,
}

impl Tap {
    fn add(netns: &str, name: &str) -> anyhow::Result<Self> {
        run(in_netns(netns, "ip").args(["tuntap", "add", "dev", name, "mode", "tap"]))?;
        let tap = Tap {
            netns: netns.to_string(),
            name: name.to_string(),
        };
        run(in_netns(netns, "ip").args(["link", "set", name, "master", "fab0", "up"]))?;
        Ok(tap)
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        let _ = in_netns(&self.netns, "ip")
            .args(["link", "delete", &self.name])
            .status();
    }
}

/// One VM booted from the node image; killed, then its tap removed, when dropped.
pub struct VirtualMachine {
    _qemu: Process,
    _tap: Tap,
    /// Its console (the serial port).
    pub console: PathBuf,
}

impl VirtualMachine {
    /// Boots `image` (its own copy-on-write overlay under `dir`) on `network` at `ip` (which
    /// must be on the fabric), with 2 vCPUs and 1 GiB under TCG.
    pub fn boot(network: &VmNetwork, image: &Path, ip: &str, dir: &Path) -> anyhow::Result<Self> {
        let address: std::net::Ipv4Addr = ip.parse()?;
        ensure!(
            ip.starts_with(&format!("{}.", network.prefix)),
            "{ip} is not on the fabric {}.0/24",
            network.prefix
        );
        let [_, _, third, fourth] = address.octets();
        let mac = format!("52:54:00:c7:{third:02x}:{fourth:02x}");
        std::fs::create_dir_all(dir)?;
        std::fs::write(
            network.hosts.join(format!("vm-{fourth}")),
            format!("{mac},{ip}\n"),
        )?;
        let disk = dir.join("disk.qcow2");
        run(Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(image)
            .arg(&disk))?;
        let tap = Tap::add(&network.netns, &format!("flvm{third:02x}{fourth:02x}"))?;
        let console = dir.join("console.log");
        let log = std::fs::File::create(dir.join("qemu.log"))?;
        let child = in_netns(&network.netns, "qemu-system-x86_64")
            .args([
                "-accel",
                "tcg,thread=multi",
                "-smp",
                "2",
                "-m",
                "1024",
                "-display",
                "none",
                "-monitor",
                "none",
                "-no-reboot",
            ])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-drive")
            .arg(format!("file={},if=virtio,format=qcow2", disk.display()))
            .args([
                "-netdev",
                &format!("tap,id=net0,ifname={},script=no,downscript=no", tap.name),
                "-device",
                &format!("virtio-net-pci,netdev=net0,mac={mac},romfile="),
            ])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting qemu-system-x86_64")?;
        Ok(VirtualMachine {
            _qemu: Process { child },
            _tap: tap,
            console,
        })
    }

    /// What the VM has written to its console so far.
    pub fn console(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.console).unwrap_or_default()).into_owned()
    }
}
