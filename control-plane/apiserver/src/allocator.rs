//! Service ClusterIP and NodePort allocation, made atomic by reservation keys in storage.

use std::net::Ipv4Addr;

use bytes::Bytes;
use flotilla_storage::Outcome;
use rand::Rng;
use serde_json::{Value, json};

use crate::error::{ApiError, FieldError, Path};
use crate::meta;
use crate::resources::ResourceInfo;
use crate::store::{CreateHooks, Store, Tenant};

/// The service network and node port range of a cluster.
#[derive(Debug, Clone)]
pub struct ServiceNetwork {
    /// First address of the service CIDR.
    pub base: Ipv4Addr,
    /// Prefix length of the service CIDR.
    pub prefix_len: u8,
    /// Inclusive NodePort range.
    pub node_ports: (u16, u16),
}

impl Default for ServiceNetwork {
    /// Upstream's defaults: `10.96.0.0/12` and `30000-32767`.
    fn default() -> Self {
        ServiceNetwork {
            base: Ipv4Addr::new(10, 96, 0, 0),
            prefix_len: 12,
            node_ports: (30000, 32767),
        }
    }
}

impl ServiceNetwork {
    fn size(&self) -> u32 {
        1u32 << (32 - u32::from(self.prefix_len))
    }

    fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - u32::from(self.prefix_len));
        u32::from(ip) & mask == u32::from(self.base) & mask
    }

    /// The address the `kubernetes` Service gets: the first usable one.
    pub fn kubernetes_service_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + 1)
    }

    /// The address of the cluster's DNS (`kube-system/kube-dns`): the tenth, as kubeadm and
    /// EKS give it (`10.96.0.10`).
    pub fn cluster_dns_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + 10)
    }

    fn cidr(&self) -> String {
        format!("{}/{}", self.base, self.prefix_len)
    }
}

/// Allocates ClusterIPs and NodePorts for Services as they are created, and releases them.
pub struct ServiceAllocator {
    network: ServiceNetwork,
}

impl ServiceAllocator {
    /// An allocator over `network`.
    pub fn new(network: ServiceNetwork) -> Self {
        ServiceAllocator { network }
    }

    fn ip_key(tenant: &Tenant, ip: &str) -> String {
        format!("{}core/serviceipallocations/{ip}", tenant.key_prefix)
    }

    fn port_key(tenant: &Tenant, port: i64) -> String {
        format!(
            "{}core/servicenodeportallocations/{port}",
            tenant.key_prefix
        )
    }

    async fn reserve(
        store: &Store,
        key: &str,
        owner: &str,
        dry_run: bool,
    ) -> Result<bool, ApiError> {
        if dry_run {
            return Ok(store.storage().get(key).await?.is_none());
        }
        Ok(matches!(
            store
                .storage()
                .create(key, Bytes::from(owner.to_string()))
                .await?,
            Outcome::Done(_)
        ))
    }

    async fn allocate_ip(
        &self,
        store: &Store,
        tenant: &Tenant,
        owner: &str,
        dry_run: bool,
    ) -> Result<String, ApiError> {
        let size = self.network.size();
        for _ in 0..64 {
            // Skip the network address and the first host (reserved for `kubernetes`).
            let offset = rand::rng().random_range(2..size.saturating_sub(1).max(3));
            let ip = Ipv4Addr::from(u32::from(self.network.base) + offset).to_string();
            if Self::reserve(store, &Self::ip_key(tenant, &ip), owner, dry_run).await? {
                return Ok(ip);
            }
        }
        Err(ApiError::internal(
            "failed to allocate a serviceIP: range is full",
        ))
    }

    async fn allocate_port(
        &self,
        store: &Store,
        tenant: &Tenant,
        owner: &str,
        dry_run: bool,
    ) -> Result<i64, ApiError> {
        let (low, high) = self.network.node_ports;
        for _ in 0..64 {
            let port = i64::from(rand::rng().random_range(low..=high));
            if Self::reserve(store, &Self::port_key(tenant, port), owner, dry_run).await? {
                return Ok(port);
            }
        }
        Err(ApiError::internal(
            "failed to allocate a nodePort: range is full",
        ))
    }
}

#[async_trait::async_trait]
impl CreateHooks for ServiceAllocator {
    async fn before_create(
        &self,
        store: &Store,
        tenant: &Tenant,
        resource: &ResourceInfo,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if resource.kind != "Service" || !resource.group.is_empty() {
            return Ok(obj);
        }
        let name = meta::name(&obj).to_string();
        let owner = format!("{}/{name}", meta::namespace(&obj));
        let ty = meta::str_at(&obj, &["spec", "type"])
            .unwrap_or("ClusterIP")
            .to_string();
        let invalid = |field: &str, value: Value, why: &str| {
            ApiError::invalid(
                "",
                "Service",
                &name,
                vec![FieldError::invalid(&Path::new(field), value.clone(), why)],
            )
        };
        if ty != "ExternalName" {
            let requested = meta::str_at(&obj, &["spec", "clusterIP"])
                .unwrap_or("")
                .to_string();
            let ip = match requested.as_str() {
                "None" => "None".to_string(),
                "" => self.allocate_ip(store, tenant, &owner, dry_run).await?,
                wanted => {
                    let parsed: Ipv4Addr = wanted.parse().map_err(|_| {
                        invalid(
                            "spec.clusterIPs[0]",
                            json!(wanted),
                            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                        )
                    })?;
                    if !self.network.contains(parsed) {
                        return Err(invalid(
                            "spec.clusterIPs",
                            json!([wanted]),
                            &format!(
                                "failed to allocate IP {wanted}: the provided IP ({wanted}) is not in the valid range. The range of valid IPs is {}",
                                self.network.cidr()
                            ),
                        ));
                    }
                    if !Self::reserve(store, &Self::ip_key(tenant, wanted), &owner, dry_run).await?
                    {
                        return Err(invalid(
                            "spec.clusterIPs",
                            json!([wanted]),
                            &format!(
                                "failed to allocate IP {wanted}: provided IP is already allocated"
                            ),
                        ));
                    }
                    wanted.to_string()
                }
            };
            meta::set_at(&mut obj, &["spec", "clusterIP"], json!(ip));
            meta::set_at(&mut obj, &["spec", "clusterIPs"], json!([ip]));
            if ip != "None" {
                meta::set_at(&mut obj, &["spec", "ipFamilies"], json!(["IPv4"]));
                meta::set_at(&mut obj, &["spec", "ipFamilyPolicy"], json!("SingleStack"));
            }
        }
        if ty == "NodePort" || ty == "LoadBalancer" {
            let mut ports = meta::at(&obj, &["spec", "ports"])
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (i, port) in ports.iter_mut().enumerate() {
                let node_port = match port.get("nodePort").and_then(Value::as_i64) {
                    Some(wanted) => {
                        let (low, high) = self.network.node_ports;
                        if wanted < i64::from(low) || wanted > i64::from(high) {
                            return Err(invalid(
                                &format!("spec.ports[{i}].nodePort"),
                                json!(wanted),
                                &format!(
                                    "provided port is not in the valid range. The range of valid ports is {low}-{high}"
                                ),
                            ));
                        }
                        if !Self::reserve(store, &Self::port_key(tenant, wanted), &owner, dry_run)
                            .await?
                        {
                            return Err(invalid(
                                &format!("spec.ports[{i}].nodePort"),
                                json!(wanted),
                                "provided port is already allocated",
                            ));
                        }
                        wanted
                    }
                    None => self.allocate_port(store, tenant, &owner, dry_run).await?,
                };
                meta::set_at(port, &["nodePort"], json!(node_port));
            }
            meta::set_at(&mut obj, &["spec", "ports"], Value::Array(ports));
        }
        Ok(obj)
    }

    async fn release(&self, store: &Store, tenant: &Tenant, resource: &ResourceInfo, obj: &Value) {
        if resource.kind != "Service" || !resource.group.is_empty() {
            return;
        }
        let mut keys = Vec::new();
        if let Some(ip) =
            meta::str_at(obj, &["spec", "clusterIP"]).filter(|ip| !ip.is_empty() && *ip != "None")
        {
            keys.push(Self::ip_key(tenant, ip));
        }
        for port in meta::at(obj, &["spec", "ports"])
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(node_port) = port.get("nodePort").and_then(Value::as_i64) {
                keys.push(Self::port_key(tenant, node_port));
            }
        }
        for key in keys {
            if let Err(err) = store.storage().delete(&key, None).await {
                tracing::warn!(%key, %err, "could not release a service allocation; it stays reserved");
            }
        }
    }
}
