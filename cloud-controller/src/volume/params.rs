//! The pure decisions of the volume controllers: StorageClass parameters as the EBS CSI
//! driver reads them, sizes, the names upstream gives PVs and VolumeAttachments, the tags of
//! a new volume, device names, and the IOPS limits of each volume type.

use std::collections::BTreeMap;

use crate::provider::CreateVolumeRequest;

/// The driver name (StorageClass `provisioner`, PV `csi.driver`, VolumeAttachment `attacher`).
pub const DRIVER: &str = "ebs.csi.aws.com";
/// Upstream's tags naming what a volume was created for.
pub const PV_NAME_TAG: &str = "kubernetes.io/created-for/pv/name";
/// The claim's name.
pub const PVC_NAME_TAG: &str = "kubernetes.io/created-for/pvc/name";
/// The claim's namespace.
pub const PVC_NAMESPACE_TAG: &str = "kubernetes.io/created-for/pvc/namespace";
/// The EBS CSI driver's own tags (`CSIVolumeName`, `ebs.csi.aws.com/cluster`).
const CSI_VOLUME_NAME_TAG: &str = "CSIVolumeName";
const CSI_CLUSTER_TAG: &str = "ebs.csi.aws.com/cluster";
/// external-provisioner's reserved prefix (fsType, secrets): never passed to the driver.
const CSI_PARAMETER_PREFIX: &str = "csi.storage.k8s.io/";
/// external-provisioner's `--default-fstype` as the EBS chart sets it.
pub const DEFAULT_FS_TYPE: &str = "ext4";
const GIB: u128 = 1 << 30;

/// A StorageClass parameter the driver refuses; the message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParameterError(pub String);

/// What a StorageClass's `parameters` ask of each new volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeParameters {
    /// `gp3` unless `type` says otherwise.
    pub volume_type: String,
    /// `iops`: total provisioned IOPS.
    pub iops: Option<i32>,
    /// `iopsPerGB`: IOPS per GiB of the claim.
    pub iops_per_gb: Option<i32>,
    /// `allowAutoIOPSPerGBIncrease`: raise IOPS to the type's minimum for small volumes.
    pub allow_iops_increase: bool,
    /// `encrypted`.
    pub encrypted: bool,
    /// `csi.storage.k8s.io/fstype` (or the driver's deprecated `fsType`).
    pub fs_type: String,
}

/// The IOPS limits of a volume type: (minimum, maximum, maximum per GiB), as the EBS CSI
/// driver caps them; `None` for the types without provisioned IOPS.
pub fn iops_limits(volume_type: &str) -> Option<(i64, i64, i64)> {
    match volume_type {
        "io1" => Some((100, 64_000, 50)),
        "io2" => Some((100, 64_000, 500)),
        "gp3" => Some((3_000, 16_000, 500)),
        _ => None,
    }
}

const VOLUME_TYPES: [&str; 7] = ["gp2", "gp3", "io1", "io2", "st1", "sc1", "standard"];

fn parse_bool(key: &str, value: &str) -> Result<bool, ParameterError> {
    // Go's strconv.ParseBool; the driver itself treats anything but "true" as false, which
    // hides typos in a security setting, so a value that is neither is refused here.
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(ParameterError(format!(
            "Could not parse invalid {key}: {value:?} is not a boolean"
        ))),
    }
}

fn parse_int(key: &str, value: &str) -> Result<i32, ParameterError> {
    value.parse::<i32>().ok().filter(|v| *v > 0).ok_or_else(|| {
        ParameterError(format!(
            "Could not parse invalid {key}: {value:?} is not a positive integer"
        ))
    })
}

impl VolumeParameters {
    /// The driver's CreateVolume parameter parsing: keys are case-insensitive, unknown keys
    /// are refused, and `type` must be a type EBS has.
    pub fn parse(parameters: &BTreeMap<String, String>) -> Result<Self, ParameterError> {
        let mut parsed = VolumeParameters {
            volume_type: "gp3".into(),
            iops: None,
            iops_per_gb: None,
            allow_iops_increase: false,
            encrypted: false,
            fs_type: DEFAULT_FS_TYPE.into(),
        };
        for (key, value) in parameters {
            let lower = key.to_ascii_lowercase();
            if let Some(reserved) = lower.strip_prefix(CSI_PARAMETER_PREFIX) {
                if reserved == "fstype" {
                    parsed.fs_type = value.clone();
                }
                // Secrets and the provisioner's other keys are not the driver's business.
                continue;
            }
            match lower.as_str() {
                "type" => {
                    if !VOLUME_TYPES.contains(&value.as_str()) {
                        return Err(ParameterError(format!(
                            "invalid StorageClass parameter type: invalid AWS VolumeType {value:?}"
                        )));
                    }
                    parsed.volume_type = value.clone();
                }
                "iops" => parsed.iops = Some(parse_int("iops", value)?),
                "iopspergb" => parsed.iops_per_gb = Some(parse_int("iopsPerGB", value)?),
                "allowautoiopspergbincrease" => {
                    parsed.allow_iops_increase = parse_bool("allowAutoIOPSPerGBIncrease", value)?;
                }
                "encrypted" => parsed.encrypted = parse_bool("encrypted", value)?,
                "fstype" => parsed.fs_type = value.clone(),
                _ => {
                    return Err(ParameterError(format!(
                        "Invalid parameter key {key} for CreateVolume"
                    )));
                }
            }
        }
        if parsed.iops.is_some() && parsed.iops_per_gb.is_some() {
            return Err(ParameterError(
                "invalid StorageClass parameters; specify either IOPS or IOPSPerGb, not both"
                    .into(),
            ));
        }
        Ok(parsed)
    }

    /// The IOPS to ask for a volume of `size_gib`: the driver's capIOPS (none asked → the
    /// type's default; below the minimum → the minimum; capped by the total and per-GiB
    /// maxima). Types without provisioned IOPS ignore both parameters, as the driver does.
    pub fn iops_for(&self, size_gib: i32) -> Option<i32> {
        let (min, max, per_gib) = iops_limits(&self.volume_type)?;
        let size = i64::from(size_gib);
        let requested = match (self.iops, self.iops_per_gb) {
            (Some(iops), _) => i64::from(iops),
            (None, Some(per)) => i64::from(per) * size,
            (None, None) => return None,
        };
        let mut iops = requested.max(min).min(max);
        if iops > per_gib * size {
            iops = per_gib * size;
            if iops < min && self.allow_iops_increase {
                iops = min;
            }
        }
        i32::try_from(iops).ok()
    }
}

/// Bytes of a Kubernetes quantity (`10Gi`, `1500M`, `1e9`, `0.5Gi`), rounded up; `None`
/// when it does not parse.
pub fn quantity_bytes(quantity: &str) -> Option<u128> {
    let quantity = quantity.trim();
    let split = quantity
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(quantity.len());
    let (number, suffix) = quantity.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = digits.parse().ok()?;
    let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let (multiplier, divisor): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "m" => (1, 1000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        exponent if exponent.starts_with(['e', 'E']) => {
            let power: u32 = exponent[1..].parse().ok()?;
            (10u128.checked_pow(power)?, 1)
        }
        _ => return None,
    };
    let numerator = mantissa.checked_mul(multiplier)?;
    Some(numerator.div_ceil(scale.checked_mul(divisor)?))
}

/// GiB of a volume for `bytes`: rounded up, at least 1 (EBS sizes are whole GiB).
pub fn size_gib(bytes: u128) -> Option<i32> {
    i32::try_from(bytes.div_ceil(GIB).max(1)).ok()
}

/// External-provisioner's PV name for a claim: `pvc-<claim uid>`.
pub fn pv_name(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// Upstream's `GetAttachmentName`: `csi-` and the hex SHA-256 of the volume handle, driver
/// and node name, concatenated.
pub fn attachment_name(volume_handle: &str, driver: &str, node_name: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{volume_handle}{driver}{node_name}").as_bytes(),
    );
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// The device names the driver hands out, in order (`/dev/xvdba` … `/dev/xvdcz`), as its
/// device allocator does.
pub fn device_names() -> impl Iterator<Item = String> {
    ["b", "c"]
        .into_iter()
        .flat_map(|first| ('a'..='z').map(move |second| format!("/dev/xvd{first}{second}")))
}

/// The first device name not in `used`.
pub fn free_device<'a>(used: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let used: Vec<&str> = used.into_iter().collect();
    device_names().find(|d| !used.contains(&d.as_str()))
}

/// Everything one claim asks of its new volume.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRequest<'a> {
    /// The cluster's resource tag (`kubernetes.io/cluster/<id>`).
    pub cluster_tag: &'a str,
    /// The cluster's id.
    pub cluster_id: &'a str,
    /// The PV to create.
    pub pv_name: &'a str,
    /// The claim.
    pub claim_name: &'a str,
    /// Its namespace.
    pub claim_namespace: &'a str,
    /// Where.
    pub zone: &'a str,
    /// Bytes requested.
    pub bytes: u128,
}

/// The CreateVolume request for a claim: upstream's tags (cluster ownership, what it was
/// created for, the driver's own), the size in whole GiB and the class's parameters.
pub fn create_request(
    parameters: &VolumeParameters,
    claim: &ClaimRequest<'_>,
) -> Result<CreateVolumeRequest, ParameterError> {
    let size_gib = size_gib(claim.bytes)
        .ok_or_else(|| ParameterError(format!("a claim of {} bytes is too big", claim.bytes)))?;
    let tags: BTreeMap<String, String> = [
        (claim.cluster_tag, "owned"),
        (CSI_CLUSTER_TAG, "true"),
        (CSI_VOLUME_NAME_TAG, claim.pv_name),
        (PV_NAME_TAG, claim.pv_name),
        (PVC_NAME_TAG, claim.claim_name),
        (PVC_NAMESPACE_TAG, claim.claim_namespace),
        ("KubernetesCluster", claim.cluster_id),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Ok(CreateVolumeRequest {
        zone: claim.zone.to_string(),
        size_gib,
        volume_type: parameters.volume_type.clone(),
        iops: parameters.iops_for(size_gib),
        encrypted: parameters.encrypted,
        tags,
        client_token: claim.pv_name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Result<VolumeParameters, ParameterError> {
        VolumeParameters::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn parameters_parse_as_the_driver_reads_them() {
        let defaults = params(&[]).expect("no parameters");
        assert_eq!(defaults.volume_type, "gp3");
        assert!(!defaults.encrypted);
        assert_eq!(defaults.fs_type, "ext4");
        // (parameters, volume type, encrypted, iops)
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, bool, Option<i32>);
        let cases: &[Case<'_>] = &[
            (
                &[("type", "io2"), ("iops", "4000")],
                "io2",
                false,
                Some(4000),
            ),
            (&[("Type", "gp2"), ("encrypted", "true")], "gp2", true, None),
            (
                &[("type", "st1"), ("ENCRYPTED", "false")],
                "st1",
                false,
                None,
            ),
            (&[("iopsPerGB", "10")], "gp3", false, None),
            (&[("csi.storage.k8s.io/fstype", "xfs")], "gp3", false, None),
            (&[("type", "standard")], "standard", false, None),
        ];
        for (pairs, volume_type, encrypted, iops) in cases {
            let parsed = params(pairs).expect("valid parameters");
            assert_eq!(&parsed.volume_type, volume_type, "{pairs:?}");
            assert_eq!(parsed.encrypted, *encrypted, "{pairs:?}");
            assert_eq!(parsed.iops, *iops, "{pairs:?}");
        }
        assert_eq!(
            params(&[("csi.storage.k8s.io/fstype", "xfs")])
                .expect("fstype")
                .fs_type,
            "xfs"
        );
    }

    #[test]
    fn invalid_parameters_name_the_parameter() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("type", "bogus")], "type"),
            (&[("type", "GP3")], "type"),
            (&[("iops", "many")], "iops"),
            (&[("iops", "-5")], "iops"),
            (&[("iopsPerGB", "1.5")], "iopsPerGB"),
            (&[("encrypted", "yes")], "encrypted"),
            (&[("color", "blue")], "color"),
            (&[("iops", "3000"), ("iopsPerGB", "10")], "IOPSPerGb"),
        ];
        for (pairs, named) in cases {
            let err = params(pairs).expect_err("refused");
            assert!(err.0.contains(named), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn iops_are_capped_as_the_driver_does() {
        let with = |volume_type: &str, iops: Option<i32>, per: Option<i32>, increase: bool| {
            VolumeParameters {
                volume_type: volume_type.into(),
                iops,
                iops_per_gb: per,
                allow_iops_increase: increase,
                encrypted: false,
                fs_type: "ext4".into(),
            }
        };
        let cases = [
            (with("gp3", None, None, false), 10, None),
            (with("gp3", Some(4000), None, false), 10, Some(4000)),
            (with("gp3", Some(1000), None, false), 100, Some(3000)),
            (with("gp3", Some(99_000), None, false), 1000, Some(16_000)),
            (with("io1", None, Some(50), false), 10, Some(500)),
            (with("io1", Some(10_000), None, false), 10, Some(500)),
            (with("io2", None, Some(10), false), 4, Some(100)),
            (with("gp3", Some(5000), None, false), 4, Some(2000)),
            (with("gp3", Some(5000), None, true), 4, Some(3000)),
            (with("gp2", Some(5000), None, false), 4, None),
        ];
        for (parameters, size, expected) in cases {
            assert_eq!(parameters.iops_for(size), expected, "{parameters:?} {size}");
        }
    }

    #[test]
    fn quantities_and_sizes() {
        let cases = [
            ("1Gi", Some(1u128 << 30)),
            ("10Gi", Some(10u128 << 30)),
            ("1500M", Some(1_500_000_000)),
            ("0.5Gi", Some(1u128 << 29)),
            ("1e9", Some(1_000_000_000)),
            ("100", Some(100)),
            ("1500m", Some(2)),
            ("Gi", None),
            ("ten", None),
            ("5Zi", None),
        ];
        for (text, bytes) in cases {
            assert_eq!(quantity_bytes(text), bytes, "{text}");
        }
        let sizes = [
            (0u128, 1),
            (1, 1),
            (1 << 30, 1),
            ((1 << 30) + 1, 2),
            (1_500_000_000, 2),
            (10 << 30, 10),
        ];
        for (bytes, gib) in sizes {
            assert_eq!(size_gib(bytes), Some(gib), "{bytes}");
        }
    }

    #[test]
    fn names_are_upstreams() {
        assert_eq!(pv_name("0a1b"), "pvc-0a1b");
        // sha256("vol-1ebs.csi.aws.comnode-1"), as Go's fmt.Sprintf("csi-%x", …) prints it.
        let name = attachment_name("vol-1", DRIVER, "node-1");
        assert_eq!(name.len(), 4 + 64);
        assert!(name.starts_with("csi-"));
        assert_eq!(name, attachment_name("vol-1", DRIVER, "node-1"));
        assert_ne!(name, attachment_name("vol-1", DRIVER, "node-2"));
        assert_eq!(
            attachment_name("", "", ""),
            "csi-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn devices_are_handed_out_in_order() {
        assert_eq!(free_device([]), Some("/dev/xvdba".into()));
        assert_eq!(
            free_device(["/dev/xvdba", "/dev/xvdbb"]),
            Some("/dev/xvdbc".into())
        );
        assert_eq!(device_names().count(), 52);
    }

    #[test]
    fn create_requests_carry_upstreams_tags() {
        let parameters = params(&[("type", "io1"), ("iopsPerGB", "50")]).expect("valid");
        let request = create_request(
            &parameters,
            &ClaimRequest {
                cluster_tag: "kubernetes.io/cluster/demo",
                cluster_id: "demo",
                pv_name: "pvc-1",
                claim_name: "data",
                claim_namespace: "default",
                zone: "us-east-1a",
                bytes: 1_500_000_000,
            },
        )
        .expect("a request");
        assert_eq!(request.size_gib, 2);
        assert_eq!(request.iops, Some(100));
        assert_eq!(request.zone, "us-east-1a");
        assert_eq!(request.client_token, "pvc-1");
        for (key, value) in [
            ("kubernetes.io/cluster/demo", "owned"),
            (PV_NAME_TAG, "pvc-1"),
            (PVC_NAME_TAG, "data"),
            (PVC_NAMESPACE_TAG, "default"),
        ] {
            assert_eq!(request.tags.get(key).map(String::as_str), Some(value));
        }
    }
}
