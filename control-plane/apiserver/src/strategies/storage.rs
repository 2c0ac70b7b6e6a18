//! Strategies of the storage kinds: PersistentVolumes and claims (Pending until bound, their
//! printer columns), StorageClasses (reclaim and binding defaults) and VolumeAttachments.

use super::*;

/// PersistentVolumes: Pending until bound, reclaim policy default.
pub struct PersistentVolumeStrategy;
impl Strategy for PersistentVolumeStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        meta::set_at(obj, &["status"], json!({"phase": "Pending"}));
    }
    fn default(&self, obj: &mut Value) {
        set_default(
            obj,
            &["spec", "persistentVolumeReclaimPolicy"],
            json!("Retain"),
        );
        set_default(obj, &["spec", "volumeMode"], json!("Filesystem"));
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Capacity", "string", "Capacity of the volume", |o| {
                json!(str_at(o, &["spec", "capacity", "storage"]).unwrap_or(""))
            }),
            Column::new("Access Modes", "string", "Access modes", |o| {
                json!(access_modes(at(o, &["spec", "accessModes"])))
            }),
            Column::new("Reclaim Policy", "string", "Reclaim policy", |o| {
                json!(str_at(o, &["spec", "persistentVolumeReclaimPolicy"]).unwrap_or(""))
            }),
            Column::new("Status", "string", "Phase", |o| {
                json!(str_at(o, &["status", "phase"]).unwrap_or(""))
            }),
            Column::new("Claim", "string", "Bound claim", |o| {
                let ns = str_at(o, &["spec", "claimRef", "namespace"]).unwrap_or("");
                let name = str_at(o, &["spec", "claimRef", "name"]).unwrap_or("");
                json!(if name.is_empty() {
                    String::new()
                } else {
                    format!("{ns}/{name}")
                })
            }),
            Column::new("StorageClass", "string", "Storage class", |o| {
                json!(str_at(o, &["spec", "storageClassName"]).unwrap_or(""))
            }),
            age_column(),
        ]
    }
}

fn access_modes(modes: Option<&Value>) -> String {
    let short = |m: &str| {
        match m {
            "ReadWriteOnce" => "RWO",
            "ReadOnlyMany" => "ROX",
            "ReadWriteMany" => "RWX",
            "ReadWriteOncePod" => "RWOP",
            other => other,
        }
        .to_string()
    };
    modes
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(short)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// PersistentVolumeClaims: Pending until bound.
pub struct PersistentVolumeClaimStrategy;
impl Strategy for PersistentVolumeClaimStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        meta::set_at(obj, &["status"], json!({"phase": "Pending"}));
    }
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["spec", "volumeMode"], json!("Filesystem"));
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Status", "string", "Phase", |o| {
                json!(str_at(o, &["status", "phase"]).unwrap_or(""))
            }),
            Column::new("Volume", "string", "Bound volume", |o| {
                json!(str_at(o, &["spec", "volumeName"]).unwrap_or(""))
            }),
            Column::new("Capacity", "string", "Capacity", |o| {
                json!(str_at(o, &["status", "capacity", "storage"]).unwrap_or(""))
            }),
            Column::new("Access Modes", "string", "Access modes", |o| {
                json!(access_modes(at(o, &["status", "accessModes"])))
            }),
            Column::new("StorageClass", "string", "Storage class", |o| {
                json!(str_at(o, &["spec", "storageClassName"]).unwrap_or(""))
            }),
            age_column(),
        ]
    }
}

/// StorageClasses: reclaim and binding defaults.
pub struct StorageClassStrategy;
impl Strategy for StorageClassStrategy {
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["reclaimPolicy"], json!("Delete"));
        set_default(obj, &["volumeBindingMode"], json!("Immediate"));
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Provisioner", "string", "Provisioner", |o| {
                json!(str_at(o, &["provisioner"]).unwrap_or(""))
            }),
            Column::new("ReclaimPolicy", "string", "Reclaim policy", |o| {
                json!(str_at(o, &["reclaimPolicy"]).unwrap_or(""))
            }),
            Column::new("VolumeBindingMode", "string", "Binding mode", |o| {
                json!(str_at(o, &["volumeBindingMode"]).unwrap_or(""))
            }),
            Column::new("AllowVolumeExpansion", "string", "Expansion allowed", |o| {
                json!(
                    at(o, &["allowVolumeExpansion"])
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                        .to_string()
                )
            }),
            age_column(),
        ]
    }
}

/// VolumeAttachments: upstream's printer columns (`kubectl get volumeattachments`).
pub struct VolumeAttachmentStrategy;
impl Strategy for VolumeAttachmentStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Attacher", "string", "The attacher", |o| {
                json!(str_at(o, &["spec", "attacher"]).unwrap_or(""))
            }),
            Column::new("PV", "string", "The persistent volume", |o| {
                json!(str_at(o, &["spec", "source", "persistentVolumeName"]).unwrap_or(""))
            }),
            Column::new("Node", "string", "The node", |o| {
                json!(str_at(o, &["spec", "nodeName"]).unwrap_or(""))
            }),
            Column::new("Attached", "boolean", "Whether it is attached", |o| {
                json!(
                    at(o, &["status", "attached"])
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                )
            }),
            age_column(),
        ]
    }
}

// ---------------------------------------------------------------- discovery, coordination
