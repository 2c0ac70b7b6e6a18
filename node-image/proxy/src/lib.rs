//! `flotilla-proxy`: the node proxy, upstream kube-proxy's nftables mode. A sans-IO model of
//! Services and EndpointSlices (`model`), a sans-IO renderer to nft scripts with incremental
//! per-Service updates (`render`), the `nft -f -` applier (`nft`) with its netlink fast path
//! for partial syncs (`batch` encodes, `netlink` commits), the health and metrics servers
//! (`health`), the kube-rs loop tying them together (`proxier`), the command line that runs
//! it (`command`), and the cluster's DNS records (`dns`).

pub mod batch;
pub mod command;
pub mod dns;
pub mod health;
pub mod model;
pub mod netlink;
pub mod nft;
pub mod proxier;
pub mod render;
