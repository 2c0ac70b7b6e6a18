//! Strategies of the workload kinds: Deployments, ReplicaSets, StatefulSets, DaemonSets
//! (apps) and Jobs, CronJobs (batch).

use super::*;

// ---------------------------------------------------------------- apps

/// Deployments: upstream defaults, selector/template validation, the rollout columns.
pub struct DeploymentStrategy;
impl Strategy for DeploymentStrategy {
    fn annotations_bump_generation(&self) -> bool {
        true
    }
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["spec", "replicas"], json!(1));
        // Field by field, as SetDefaults_Deployment: a rollingUpdate naming only one bound
        // gets the other's 25%.
        set_default(obj, &["spec", "strategy", "type"], json!("RollingUpdate"));
        if obj["spec"]["strategy"]["type"] == "RollingUpdate" {
            for bound in ["maxUnavailable", "maxSurge"] {
                set_default(
                    obj,
                    &["spec", "strategy", "rollingUpdate", bound],
                    json!("25%"),
                );
            }
        }
        set_default(obj, &["spec", "revisionHistoryLimit"], json!(10));
        set_default(obj, &["spec", "progressDeadlineSeconds"], json!(600));
        default_template(obj, &["spec", "template", "spec"]);
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_workload(obj, true)
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            ready_of_desired_column(),
            Column::new(
                "Up-to-date",
                "integer",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                |o| int_at(o, &["status", "updatedReplicas"]),
            ),
            Column::new(
                "Available",
                "integer",
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                |o| int_at(o, &["status", "availableReplicas"]),
            ),
            age_column(),
            Column::new(
                "Containers",
                "string",
                "Names of each container in the template.",
                |o| json!(container_field(o, "name")),
            )
            .wide(),
            Column::new(
                "Images",
                "string",
                "Images referenced by each container in the template.",
                |o| json!(container_field(o, "image")),
            )
            .wide(),
            Column::new("Selector", "string", "Label selector for pods.", |o| {
                json!(selector_string(at(o, &["spec", "selector"])))
            })
            .wide(),
        ]
    }
}

/// `READY` as `ready/desired` replicas (Deployments, StatefulSets).
fn ready_of_desired_column() -> Column {
    Column::new(
        "Ready",
        "string",
        "Number of the pod with ready state",
        |o| {
            json!(format!(
                "{}/{}",
                int_at(o, &["status", "readyReplicas"]),
                int_at(o, &["spec", "replicas"])
            ))
        },
    )
}

fn container_field(obj: &Value, field: &str) -> String {
    at(obj, &["spec", "template", "spec", "containers"])
        .and_then(Value::as_array)
        .map(|c| {
            c.iter()
                .filter_map(|c| c.get(field).and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// A metav1 LabelSelector in its string form, as `Scale.status.selector` and tables show it.
pub fn selector_string(selector: Option<&Value>) -> String {
    selector
        .and_then(|s| flotilla_api_machinery::selector::LabelSelector::from_json(s).ok())
        .map(|s| s.to_string())
        .unwrap_or_default()
}

/// ReplicaSets.
pub struct ReplicaSetStrategy;
const REPLICA_SET_FIELDS: &[FieldLabel] =
    &[FieldLabel::new("status.replicas", &["status", "replicas"]).or("0")];

impl Strategy for ReplicaSetStrategy {
    fn field_labels(&self) -> &'static [FieldLabel] {
        REPLICA_SET_FIELDS
    }
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["spec", "replicas"], json!(1));
        default_template(obj, &["spec", "template", "spec"]);
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_workload(obj, true)
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Desired", "integer", "Number of desired pods.", |o| {
                int_at(o, &["spec", "replicas"])
            }),
            Column::new(
                "Current",
                "integer",
                "Number of actually running pods.",
                |o| int_at(o, &["status", "replicas"]),
            ),
            Column::new("Ready", "integer", "Number of ready pods.", |o| {
                int_at(o, &["status", "readyReplicas"])
            }),
            age_column(),
        ]
    }
}

/// StatefulSets.
pub struct StatefulSetStrategy;
impl Strategy for StatefulSetStrategy {
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["spec", "replicas"], json!(1));
        set_default(obj, &["spec", "podManagementPolicy"], json!("OrderedReady"));
        set_default(
            obj,
            &["spec", "updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
        );
        set_default(obj, &["spec", "revisionHistoryLimit"], json!(10));
        set_default(
            obj,
            &["spec", "persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
        );
        default_template(obj, &["spec", "template", "spec"]);
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_workload(obj, true)
    }
    fn columns(&self) -> Vec<Column> {
        vec![name_column(), ready_of_desired_column(), age_column()]
    }
}

/// DaemonSets.
pub struct DaemonSetStrategy;
impl Strategy for DaemonSetStrategy {
    fn default(&self, obj: &mut Value) {
        set_default(
            obj,
            &["spec", "updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
        );
        set_default(obj, &["spec", "revisionHistoryLimit"], json!(10));
        default_template(obj, &["spec", "template", "spec"]);
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_workload(obj, false)
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new(
                "Desired",
                "integer",
                "The total number of nodes that should be running the daemon pod.",
                |o| int_at(o, &["status", "desiredNumberScheduled"]),
            ),
            Column::new(
                "Current",
                "integer",
                "The number of nodes running at least one daemon pod.",
                |o| int_at(o, &["status", "currentNumberScheduled"]),
            ),
            Column::new(
                "Ready",
                "integer",
                "The number of nodes that should be running the daemon pod and have one or more running and ready.",
                |o| int_at(o, &["status", "numberReady"]),
            ),
            Column::new(
                "Up-to-date",
                "integer",
                "The total number of nodes that are running updated daemon pod",
                |o| int_at(o, &["status", "updatedNumberScheduled"]),
            ),
            Column::new(
                "Available",
                "integer",
                "The number of nodes that should be running the daemon pod and have one or more running and available.",
                |o| int_at(o, &["status", "numberAvailable"]),
            ),
            Column::new("Node Selector", "string", "The node selector", |o| {
                let sel: Vec<String> =
                    meta::string_map(at(o, &["spec", "template", "spec", "nodeSelector"]))
                        .into_iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect();
                or_none(Some(&sel.join(",")))
            }),
            age_column(),
        ]
    }
}

// ---------------------------------------------------------------- batch

/// Jobs: generated selector and `controller-uid` labels, batch defaults.
pub struct JobStrategy;
impl Strategy for JobStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        let manual = at(obj, &["spec", "manualSelector"]) == Some(&json!(true));
        let uid = meta::uid(obj).to_string();
        if !manual && !uid.is_empty() {
            let name = meta::name(obj).to_string();
            meta::set_at(
                obj,
                &["spec", "selector"],
                json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}),
            );
            for (key, value) in [
                ("batch.kubernetes.io/controller-uid", uid.clone()),
                ("batch.kubernetes.io/job-name", name.clone()),
                ("controller-uid", uid),
                ("job-name", name),
            ] {
                meta::set_at(
                    obj,
                    &["spec", "template", "metadata", "labels", key],
                    json!(value),
                );
            }
        }
    }
    fn default(&self, obj: &mut Value) {
        let completions_unset = at(obj, &["spec", "completions"]).is_none_or(Value::is_null);
        let parallelism_unset = at(obj, &["spec", "parallelism"]).is_none_or(Value::is_null);
        if completions_unset && parallelism_unset {
            meta::set_at(obj, &["spec", "completions"], json!(1));
        }
        set_default(obj, &["spec", "parallelism"], json!(1));
        set_default(obj, &["spec", "backoffLimit"], json!(6));
        set_default(obj, &["spec", "completionMode"], json!("NonIndexed"));
        set_default(obj, &["spec", "suspend"], json!(false));
        set_default(
            obj,
            &["spec", "podReplacementPolicy"],
            json!("TerminatingOrFailed"),
        );
        default_template(obj, &["spec", "template", "spec"]);
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errors =
            validate_pod_spec(at(obj, &["spec", "template", "spec"]), "spec.template.spec");
        let policy = at(obj, &["spec", "template", "spec", "restartPolicy"]);
        if let Some(policy) = policy
            && !["OnFailure", "Never"].contains(&policy.as_str().unwrap_or(""))
        {
            errors.push(FieldError::not_supported(
                &Path::new("spec.template.spec.restartPolicy"),
                policy.clone(),
                &["OnFailure", "Never"],
            ));
        }
        errors
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Status", "string", "Status of the job.", |o| {
                let conditions = at(o, &["status", "conditions"])
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let has = |t: &str| {
                    conditions.iter().any(|c| {
                        c.get("type") == Some(&json!(t)) && c.get("status") == Some(&json!("True"))
                    })
                };
                json!(if has("Complete") {
                    "Complete"
                } else if has("Failed") {
                    "Failed"
                } else if has("Suspended") {
                    "Suspended"
                } else {
                    "Running"
                })
            }),
            Column::new(
                "Completions",
                "string",
                "The completion status of the job.",
                |o| {
                    let done = int_at(o, &["status", "succeeded"]);
                    match at(o, &["spec", "completions"]).and_then(Value::as_i64) {
                        Some(c) => json!(format!("{done}/{c}")),
                        None => json!(format!(
                            "{done}/1 of {}",
                            int_at(o, &["spec", "parallelism"])
                        )),
                    }
                },
            ),
            Column::new(
                "Duration",
                "string",
                "Time required to complete the job.",
                |o| {
                    let start = str_at(o, &["status", "startTime"])
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                    let end = str_at(o, &["status", "completionTime"])
                        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                    match (start, end) {
                        (Some(s), Some(e)) => {
                            json!(crate::table::human_duration((e - s).num_seconds()))
                        }
                        (Some(s), None) => json!(crate::table::human_duration(
                            chrono::Utc::now().signed_duration_since(s).num_seconds()
                        )),
                        _ => json!(""),
                    }
                },
            ),
            age_column(),
        ]
    }
}

/// CronJobs.
pub struct CronJobStrategy;
impl Strategy for CronJobStrategy {
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["spec", "concurrencyPolicy"], json!("Allow"));
        set_default(obj, &["spec", "suspend"], json!(false));
        set_default(obj, &["spec", "successfulJobsHistoryLimit"], json!(3));
        set_default(obj, &["spec", "failedJobsHistoryLimit"], json!(1));
        default_template(obj, &["spec", "jobTemplate", "spec", "template", "spec"]);
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if str_at(obj, &["spec", "schedule"]).is_none_or(str::is_empty) {
            errors.push(FieldError::required(&Path::new("spec.schedule"), ""));
        }
        errors.extend(validate_pod_spec(
            at(obj, &["spec", "jobTemplate", "spec", "template", "spec"]),
            "spec.jobTemplate.spec.template.spec",
        ));
        errors
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Schedule", "string", "The schedule", |o| {
                json!(str_at(o, &["spec", "schedule"]).unwrap_or(""))
            }),
            Column::new("Timezone", "string", "The time zone", |o| {
                or_none(str_at(o, &["spec", "timeZone"]))
            }),
            Column::new("Suspend", "boolean", "Whether it is suspended", |o| {
                json!(
                    at(o, &["spec", "suspend"])
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                )
            }),
            Column::new("Active", "integer", "Active jobs", |o| {
                json!(array_len(o, &["status", "active"]))
            }),
            Column::new(
                "Last Schedule",
                "string",
                "Last schedule time",
                |o| match str_at(o, &["status", "lastScheduleTime"]) {
                    Some(t) => json!(crate::table::since(Some(t))),
                    None => json!("<none>"),
                },
            ),
            age_column(),
        ]
    }
}
