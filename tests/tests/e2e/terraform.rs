//! Terraform against the real service: the stock `terraform` binary loads
//! `terraform-provider-flotilla` (plugin protocol 6), configured from the client configuration
//! `flotilla up` writes or from the environment alone, reads a cluster with `data
//! "flotilla_cluster"` into outputs, and reports bad input on the attribute that caused it.

use anyhow::{Context, ensure};
use flotilla_e2e::terraform::Terraform;
use flotilla_e2e::{Backend, Flotilla};

fn main_tf(provider: &str, cluster: &str) -> String {
    format!(
        r#"terraform {{
  required_providers {{
    flotilla = {{ source = "flotilla/flotilla" }}
  }}
}}

provider "flotilla" {{
{provider}}}

data "flotilla_cluster" "this" {{
  name = "{cluster}"
}}

output "endpoint" {{ value = data.flotilla_cluster.this.endpoint }}
output "status" {{ value = data.flotilla_cluster.this.status }}
output "version" {{ value = data.flotilla_cluster.this.version }}
output "ca" {{ value = data.flotilla_cluster.this.certificate_authority }}
"#
    )
}

/// The kubeconfig and token data sources with their (sensitive) outputs; the token is minted
/// anew on every read, so a configuration holding it always plans an output change.
const AUTH_TF: &str = r#"
data "flotilla_kubeconfig" "this" {
  name = data.flotilla_cluster.this.name
}

data "flotilla_cluster_auth" "this" {
  name = data.flotilla_cluster.this.name
}

output "kubeconfig" {
  value     = data.flotilla_kubeconfig.this.kubeconfig
  sensitive = true
}

output "token" {
  value     = data.flotilla_cluster_auth.this.token
  sensitive = true
}
"#;

#[test]
fn terraform_reads_a_cluster_through_the_provider() -> anyhow::Result<()> {
    let flotilla = Flotilla::up(Backend::Embedded)?;
    let config = flotilla.data_dir().join("flotilla.json");
    let config = config.to_string_lossy().into_owned();
    let started = std::time::Instant::now();

    // The client configuration `flotilla up` wrote, named in the provider block.
    let terraform = Terraform::new(&main_tf(&format!("  config_file = \"{config}\"\n"), "demo"))?;
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let outputs: serde_json::Value =
        serde_json::from_str(&terraform.ok(&["output", "-json"], &[])?)?;
    ensure!(
        outputs["status"]["value"] == "ACTIVE"
            && outputs["version"]["value"] == "1.33"
            && outputs["endpoint"]["value"]
                .as_str()
                .is_some_and(|e| e.starts_with("https://") && e.ends_with("/clusters/demo"))
            && outputs["ca"]["value"]
                .as_str()
                .is_some_and(|ca| !ca.is_empty()),
        "the outputs describe cluster demo: {outputs}"
    );
    // Planned again, nothing changes.
    let plan = terraform.run(&["plan", "-detailed-exitcode", "-no-color"], &[])?;
    ensure!(
        plan.status.code() == Some(0),
        "a second plan shows no changes: {}",
        String::from_utf8_lossy(&plan.stdout)
    );
    eprintln!(
        "terraform: apply + output + plan of a data source: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The kubeconfig and the short-lived token reach the cluster's API with stock kubectl.
    terraform.write(&format!(
        "{}{AUTH_TF}",
        main_tf(&format!("  config_file = \"{config}\"\n"), "demo")
    ))?;
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let kubeconfig = terraform.dir().join("out.kubeconfig");
    std::fs::write(
        &kubeconfig,
        terraform.ok(&["output", "-raw", "kubeconfig"], &[])?,
    )?;
    let namespaces = flotilla_e2e::Kubectl::new(&kubeconfig).ok(&["get", "namespaces"])?;
    ensure!(
        namespaces.contains("kube-system"),
        "kubectl with the data source's kubeconfig: {namespaces}"
    );
    let token = terraform.ok(&["output", "-raw", "token"], &[])?;
    let with_token = flotilla.kubectl().with_token(token.trim())?;
    let namespaces = with_token.ok(&["get", "namespaces"])?;
    ensure!(
        namespaces.contains("default"),
        "kubectl with the data source's token: {namespaces}"
    );

    // An empty provider block: the environment the CLI reads is enough.
    terraform.write(&main_tf("", "demo"))?;
    terraform.ok(&["plan", "-input=false"], &[("FLOTILLA_CONFIG", &config)])?;

    // A cluster that does not exist: the API's error, on the `name` line.
    terraform.write(&main_tf(&format!("  config_file = \"{config}\"\n"), "nope"))?;
    let missing = terraform.fails(&["plan", "-input=false"], &[])?;
    ensure!(
        missing.contains("ResourceNotFoundException (404): no cluster named \"nope\"")
            && missing.contains("data \"flotilla_cluster\" \"this\""),
        "the API's message on the data source: {missing}"
    );

    // A wrong API key: one clear line naming the refusal.
    terraform.write(&main_tf(
        &format!("  config_file = \"{config}\"\n  api_key = \"wrong\"\n"),
        "demo",
    ))?;
    let refused = terraform.fails(&["plan", "-input=false"], &[])?;
    ensure!(
        refused.contains("(401)") || refused.contains("Unauthorized"),
        "a wrong API key is refused in one line: {refused}"
    );

    // No endpoint anywhere: the provider block's attribute is named.
    terraform.write(&main_tf("", "demo"))?;
    let unconfigured = terraform.fails(&["plan", "-input=false"], &[])?;
    ensure!(
        unconfigured.contains("no endpoint: set endpoint, FLOTILLA_ENDPOINT or a config_file"),
        "an unconfigured provider says what to set: {unconfigured}"
    );
    Ok(())
}

fn cluster_tf(config: &str, tags: &str) -> String {
    format!(
        r#"terraform {{
  required_providers {{
    flotilla = {{ source = "flotilla/flotilla" }}
  }}
}}

provider "flotilla" {{
  config_file = "{config}"
}}

resource "flotilla_cluster" "tf" {{
  name = "tf"
  tags = {{ {tags} }}
  timeouts {{
    create = "5m"
    delete = "5m"
  }}
}}

output "id" {{ value = flotilla_cluster.tf.id }}
output "status" {{ value = flotilla_cluster.tf.status }}
output "endpoint" {{ value = flotilla_cluster.tf.endpoint }}
output "arn" {{ value = flotilla_cluster.tf.arn }}
"#
    )
}

/// Node pool `workers` of cluster `tf`, as `flotilla nodepool list` shows it.
fn workers_pool(cli: &flotilla_e2e::FlotillaCli) -> anyhow::Result<serde_json::Value> {
    let list: serde_json::Value =
        serde_json::from_str(&cli.ok(&["nodepool", "list", "tf", "-o", "json"])?)?;
    Ok(list["nodePools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|pool| pool["name"] == "workers")
        .cloned()
        .unwrap_or_default())
}

/// `terraform plan -detailed-exitcode`: 0 no changes, 2 changes (with the plan's text).
fn plan(terraform: &Terraform) -> anyhow::Result<(i32, String)> {
    let out = terraform.run(
        &["plan", "-detailed-exitcode", "-no-color", "-input=false"],
        &[],
    )?;
    Ok((
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

#[test]
fn terraform_manages_a_cluster() -> anyhow::Result<()> {
    let flotilla = Flotilla::up(Backend::Embedded)?;
    let config = flotilla.data_dir().join("flotilla.json");
    let config = config.to_string_lossy().into_owned();
    let cli = flotilla_e2e::FlotillaCli {
        config: flotilla.data_dir().join("flotilla.json"),
    };
    let terraform = Terraform::new(&cluster_tf(&config, r#"team = "infra""#))?;

    // Create: waits until ACTIVE; the outputs are the cluster's.
    let started = std::time::Instant::now();
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    eprintln!(
        "terraform: apply of a flotilla_cluster → ACTIVE: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let outputs: serde_json::Value =
        serde_json::from_str(&terraform.ok(&["output", "-json"], &[])?)?;
    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["cluster", "get", "tf", "-o", "json"])?)?;
    ensure!(
        outputs["status"]["value"] == "ACTIVE"
            && outputs["id"]["value"] == listed["id"]
            && outputs["arn"]["value"] == "arn:flotilla:clusters::default:cluster/tf"
            && listed["tags"]["team"] == "infra",
        "the cluster Terraform made: {outputs} / {listed}"
    );
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "a second plan shows no changes:\n{text}");

    // A tag changed: an in-place update, applied.
    terraform.write(&cluster_tf(&config, r#"team = "platform", tier = "gold""#))?;
    let (code, text) = plan(&terraform)?;
    ensure!(
        code == 2
            && text.contains("will be updated in-place")
            && !text.contains("must be replaced"),
        "a tag change updates in place:\n{text}"
    );
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["cluster", "get", "tf", "-o", "json"])?)?;
    ensure!(
        listed["tags"] == serde_json::json!({"team": "platform", "tier": "gold"}),
        "the tags were updated: {listed}"
    );
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "no changes after the update:\n{text}");

    // Pod Security defaults: set in place, checked at plan, and back to upstream's defaults
    // when the block goes.
    let tags = r#"team = "platform", tier = "gold""#;
    let with_pod_security = |block: &str| {
        cluster_tf(&config, tags).replace("  timeouts {", &format!("{block}  timeouts {{"))
    };
    terraform.write(&with_pod_security(
        "  pod_security {\n    enforce = \"baseline\"\n    exempt_namespaces = [\"kube-system\"]\n  }\n",
    ))?;
    let (code, text) = plan(&terraform)?;
    ensure!(
        code == 2
            && text.contains("will be updated in-place")
            && !text.contains("must be replaced"),
        "pod_security updates in place:\n{text}"
    );
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["cluster", "get", "tf", "-o", "json"])?)?;
    ensure!(
        listed["podSecurity"]["defaults"]["enforce"] == "baseline"
            && listed["podSecurity"]["exemptions"]["namespaces"]
                == serde_json::json!(["kube-system"]),
        "the cluster's podSecurity: {listed}"
    );
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "no changes after setting pod_security:\n{text}");
    terraform.write(&with_pod_security(
        "  pod_security {\n    enforce = \"strict\"\n  }\n",
    ))?;
    let (code, text) = plan(&terraform)?;
    ensure!(
        code == 1 && text.contains(r#""strict" is not a Pod Security level"#),
        "an unknown level is refused at plan:\n{text}"
    );
    terraform.write(&cluster_tf(&config, tags))?;
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let listed: serde_json::Value =
        serde_json::from_str(&cli.ok(&["cluster", "get", "tf", "-o", "json"])?)?;
    ensure!(
        listed["podSecurity"]["defaults"]["enforce"] == "privileged",
        "the block removed restores the defaults: {listed}"
    );

    // Import into an empty state: nothing to change. (A `timeouts` block is configuration
    // Terraform keeps in the state, which an import cannot know: with one, the first plan after
    // an import records it as an in-place update.)
    let tags = r#"team = "platform", tier = "gold""#;
    terraform.write(&cluster_tf(&config, tags).replace(
        "  timeouts {\n    create = \"5m\"\n    delete = \"5m\"\n  }\n",
        "",
    ))?;
    std::fs::remove_file(terraform.dir().join("terraform.tfstate"))?;
    terraform.ok(
        &["import", "-input=false", "flotilla_cluster.tf", "tf"],
        &[],
    )?;
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "an imported cluster plans no changes:\n{text}");

    // Deleted behind Terraform's back: planned for creation, not an error.
    cli.ok(&["cluster", "delete", "tf", "--wait"])?;
    let (code, text) = plan(&terraform)?;
    ensure!(
        code == 2 && text.contains("will be created"),
        "a cluster deleted outside Terraform is re-created:\n{text}"
    );
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;

    // A timeout that is not a duration: refused at plan, on its attribute.
    terraform.write(
        &cluster_tf(&config, r#"team = "platform", tier = "gold""#)
            .replace(r#"create = "5m""#, r#"create = "5 minutes""#),
    )?;
    let refused = terraform.fails(&["plan", "-input=false"], &[])?;
    ensure!(
        refused.contains(r#""5 minutes" is not a duration"#)
            && refused.contains(r#"in resource "flotilla_cluster" "tf""#),
        "a bad timeout is refused at plan: {refused}"
    );

    // An invalid name: refused at plan, on the attribute's line, with the API's own rule.
    terraform
        .write(&cluster_tf(&config, "").replace(r#"name = "tf""#, r#"name = "Not_A_Name""#))?;
    let refused = terraform.fails(&["plan", "-input=false"], &[])?;
    ensure!(
        refused.contains(r#"cluster name "Not_A_Name" is invalid"#)
            && refused.contains(r#"name = "Not_A_Name""#),
        "an invalid name is refused at plan on its line: {refused}"
    );

    // A range the API would refuse: at plan, on its attribute, with the API's rule.
    terraform.write(&cluster_tf(&config, "").replace(
        r#"name = "tf""#,
        "name = \"tf\"\n  service_ipv4_cidr = \"10.96.0.1/12\"",
    ))?;
    let refused = terraform.fails(&["plan", "-input=false"], &[])?;
    ensure!(
        refused.contains(r#""10.96.0.1/12" is invalid: host bits must be zero"#)
            && refused.contains(r#"service_ipv4_cidr = "10.96.0.1/12""#),
        "an invalid range is refused at plan on its line: {refused}"
    );

    // A node pool of the cluster: created ACTIVE (no cloud: no instances), resized in place,
    // imported by CLUSTER/POOL, and a desired size outside min..max refused at plan time on
    // its attribute.
    let with_pool = |desired: u32| {
        format!(
            "{}\nresource \"flotilla_node_pool\" \"workers\" {{\n  cluster_name = flotilla_cluster.tf.name\n  name = \"workers\"\n  min_size = 1\n  max_size = 3\n  desired_size = {desired}\n  labels = {{ pool = \"workers\" }}\n  taint {{\n    key = \"dedicated\"\n    value = \"batch\"\n    effect = \"NO_SCHEDULE\"\n  }}\n}}\n",
            cluster_tf(&config, r#"team = "platform", tier = "gold""#)
        )
    };
    terraform.write(&with_pool(1))?;
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let pool = workers_pool(&cli)?;
    ensure!(
        pool["taints"]
            == serde_json::json!([{"key": "dedicated", "value": "batch", "effect": "NO_SCHEDULE"}]),
        "the pool's taint: {pool}"
    );
    ensure!(
        pool["status"] == "ACTIVE"
            && pool["scalingConfig"]["desiredSize"] == 1
            && pool["labels"]["pool"] == "workers",
        "the pool Terraform made: {pool}"
    );
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "no changes after creating the pool:\n{text}");
    terraform.write(&with_pool(2))?;
    let (code, text) = plan(&terraform)?;
    ensure!(
        code == 2
            && text.contains("will be updated in-place")
            && !text.contains("must be replaced"),
        "a resize updates in place:\n{text}"
    );
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let pool = workers_pool(&cli)?;
    ensure!(pool["scalingConfig"]["desiredSize"] == 2, "resized: {pool}");
    terraform.ok(&["state", "rm", "flotilla_node_pool.workers"], &[])?;
    terraform.ok(
        &[
            "import",
            "-input=false",
            "flotilla_node_pool.workers",
            "tf/workers",
        ],
        &[],
    )?;
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "an imported pool plans no changes:\n{text}");
    // The pool deleted behind Terraform's back: planned for creation, and re-created.
    cli.ok(&["nodepool", "delete", "tf", "workers", "--wait"])?;
    let (code, text) = plan(&terraform)?;
    ensure!(
        code == 2
            && text.contains("flotilla_node_pool.workers will be created")
            && !text.contains("flotilla_cluster.tf will be"),
        "a pool deleted outside Terraform is re-created:\n{text}"
    );
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    ensure!(workers_pool(&cli)?["status"] == "ACTIVE", "re-created");
    terraform.write(&with_pool(1).replace("NO_SCHEDULE", "NoSchedule"))?;
    let refused = terraform.fails(&["plan", "-input=false"], &[])?;
    ensure!(
        refused.contains(
            r#"taint effect "NoSchedule" is not one of NO_SCHEDULE, NO_EXECUTE, PREFER_NO_SCHEDULE"#
        ),
        "a Kubernetes-spelled effect is refused at plan: {refused}"
    );
    terraform.write(&with_pool(5))?;
    let refused = terraform.fails(&["plan", "-input=false"], &[])?;
    ensure!(
        refused.contains("desired_size 5 is outside 1..=3") && refused.contains("desired_size"),
        "a desired size outside min..max is refused at plan on its attribute: {refused}"
    );

    // An autoscaled pool: with `ignore_changes = [desired_size]`, a scale made outside
    // Terraform (an autoscaler's) plans nothing.
    terraform.write(&with_pool(2).replace(
        "  taint {",
        "  lifecycle {\n    ignore_changes = [desired_size]\n  }\n  taint {",
    ))?;
    cli.ok(&[
        "nodepool",
        "scale",
        "tf",
        "workers",
        "--desired",
        "3",
        "--wait",
    ])?;
    let (code, text) = plan(&terraform)?;
    ensure!(
        code == 0,
        "an ignored desired size plans no changes after a scale outside Terraform:\n{text}"
    );

    // Destroy leaves nothing.
    terraform.write(&with_pool(2))?;
    terraform.ok(&["destroy", "-auto-approve", "-input=false"], &[])?;
    let names = cli.ok(&["cluster", "list", "-o", "json"])?;
    ensure!(!names.contains("\"tf\""), "the cluster is gone: {names}");

    // A name already taken (made outside Terraform): the API's message, on the name.
    cli.ok(&["cluster", "create", "tf", "--wait"])?;
    terraform.write(&cluster_tf(&config, ""))?;
    let refused = terraform.fails(&["apply", "-auto-approve", "-input=false"], &[])?;
    ensure!(
        refused.contains(r#"cluster "tf" already exists"#) && refused.contains(r#"name = "tf""#),
        "a taken name fails with the API's message on its attribute: {refused}"
    );
    Ok(())
}

fn account_tf(operator_config: &str, id: &str) -> String {
    format!(
        r#"terraform {{
  required_providers {{
    flotilla = {{ source = "flotilla/flotilla" }}
  }}
}}

provider "flotilla" {{
  config_file = "{operator_config}"
}}

resource "flotilla_account" "team" {{
  id = "{id}"
}}
"#
    )
}

/// The account's key as an output (left out after an import, which has no key).
const KEY_OUTPUT: &str = r#"
output "api_key" {
  value     = flotilla_account.team.api_key
  sensitive = true
}
"#;

/// `flotilla_account` with the operator's credentials: created with its first API key (which
/// works), a clean plan, refused at plan for a bad id, re-created when deleted behind
/// Terraform's back, not destroyed while it has a cluster (the API's message, and the state
/// keeps it), imported (without a key), destroyed (its key then fails).
#[test]
fn terraform_manages_an_account_with_the_operators_credentials() -> anyhow::Result<()> {
    let flotilla = Flotilla::up(Backend::Embedded)?;
    let operator = flotilla.data_dir().join("operator.json");
    let operator_cli = flotilla_e2e::FlotillaCli {
        config: operator.clone(),
    };
    let operator = operator.display().to_string();
    let with_key = account_tf(&operator, "team-a") + KEY_OUTPUT;
    let terraform = Terraform::new(&with_key)?;
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let key = terraform.ok(&["output", "-raw", "api_key"], &[])?;
    ensure!(key.starts_with("flo_"), "the account's API key: {key:?}");
    // A client configuration with the new key: the CLI acts as the account.
    let mut team_config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        flotilla.data_dir().join("flotilla.json"),
    )?)?;
    team_config["apiKey"] = key.trim().into();
    let team_config_path = terraform.dir().join("team-a.json");
    std::fs::write(&team_config_path, team_config.to_string())?;
    let team = flotilla_e2e::FlotillaCli {
        config: team_config_path,
    };
    team.ok(&["cluster", "list"])?;
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "a second plan shows no changes:\n{text}");

    let refused = {
        terraform.write(&account_tf(&operator, "Team_A"))?;
        terraform.fails(&["plan", "-input=false"], &[])?
    };
    ensure!(
        refused.contains(r#"account id "Team_A" is invalid"#)
            && refused.contains(r#"id = "Team_A""#),
        "an invalid id is refused at plan on its line: {refused}"
    );
    terraform.write(&with_key)?;

    // Deleted behind Terraform's back: planned for creation (with a new key).
    operator_cli.ok(&["account", "delete", "team-a"])?;
    let (code, text) = plan(&terraform)?;
    ensure!(
        code == 2 && text.contains("flotilla_account.team will be created"),
        "an account deleted outside Terraform is re-created:\n{text}"
    );
    terraform.ok(&["apply", "-auto-approve", "-input=false"], &[])?;
    let key = terraform.ok(&["output", "-raw", "api_key"], &[])?;
    team_config["apiKey"] = key.trim().into();
    std::fs::write(&team.config, team_config.to_string())?;

    // An account with a cluster is not destroyed: the API's message, and it stays in the state.
    team.ok(&["cluster", "create", "keep", "--wait"])?;
    let refused = terraform.fails(&["destroy", "-auto-approve", "-input=false"], &[])?;
    ensure!(
        refused.contains(r#"account "team-a" still has clusters (keep); delete them first"#),
        "an account with clusters is not destroyed: {refused}"
    );
    let listed = terraform.ok(&["state", "list"], &[])?;
    ensure!(
        listed.contains("flotilla_account.team"),
        "the refused destroy keeps it in the state: {listed}"
    );
    team.ok(&["cluster", "delete", "keep", "--wait"])?;

    // Imported into an empty state: the account, without a key (shown only once).
    terraform.write(&account_tf(&operator, "team-a"))?;
    std::fs::remove_file(terraform.dir().join("terraform.tfstate"))?;
    terraform.ok(
        &["import", "-input=false", "flotilla_account.team", "team-a"],
        &[],
    )?;
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "an imported account plans no changes:\n{text}");

    terraform.ok(&["destroy", "-auto-approve", "-input=false"], &[])?;
    let listed = operator_cli.ok(&["account", "list", "-o", "json"])?;
    ensure!(!listed.contains("team-a"), "the account is gone: {listed}");
    let refused = team.fails(&["cluster", "list"])?;
    ensure!(
        refused.contains("401") || refused.contains("Unauthorized"),
        "the deleted account's key no longer works: {refused}"
    );
    Ok(())
}

/// The `cluster` module on LocalStack: `terraform init` offline, `apply` makes the VPC, subnets,
/// route tables and security group with hashicorp/aws and the cluster and its pool with ours;
/// the pool's instances join (the local hypervisor's real nodes where containerd is available)
/// and stock kubectl with the module's kubeconfig lists them; a second plan changes nothing;
/// `destroy` leaves no cluster, instance or VPC.
#[test]
fn terraform_applies_the_cluster_module_on_localstack() -> anyhow::Result<()> {
    use flotilla_e2e::hypervisor::Hypervisor;
    use flotilla_e2e::nodes::Fabric;
    use std::time::{Duration, Instant};

    let aws = flotilla_e2e::LocalStack::start()?;
    let fabric_dir = tempfile::tempdir()?;
    let fabric = match flotilla_e2e::nodes::require_runtime() {
        Ok(()) => Some(Fabric::start(&fabric_dir.path().join("fabric"))?),
        Err(err) => {
            eprintln!("terraform: simulated nodes ({err:#})");
            None
        }
    };
    let flotilla = match &fabric {
        Some(fabric) => Flotilla::up_at(Backend::Embedded, &fabric.host_ip, &[])?,
        None => Flotilla::up(Backend::Embedded)?,
    };
    let _hypervisor = match fabric {
        Some(fabric) => Hypervisor::start_real(aws.port, fabric)?,
        None => Hypervisor::start(aws.port)?,
    };
    let config = flotilla.data_dir().join("flotilla.json");
    let modules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../terraform/modules");
    let main_tf = format!(
        r#"terraform {{
  required_providers {{
    aws      = {{ source = "hashicorp/aws", version = "5.100.0" }}
    flotilla = {{ source = "flotilla/flotilla" }}
  }}
}}

provider "aws" {{
  region                      = "us-east-1"
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  endpoints {{
    ec2 = "{endpoint}"
    sts = "{endpoint}"
  }}
}}

provider "flotilla" {{
  config_file = "{config}"
}}

module "cluster" {{
  source            = "./modules/cluster"
  name              = "tfprod"
  cloud_endpoint    = "{endpoint}"
  access_key_id     = "test"
  secret_access_key = "test"
  node_count        = 2
  tags              = {{ team = "platform" }}
}}

output "kubeconfig" {{ value = module.cluster.kubeconfig }}

output "vpc_id" {{ value = module.cluster.vpc_id }}
"#,
        endpoint = aws.endpoint,
        config = config.display(),
    );
    let terraform = Terraform::with_mirrors(&main_tf)?;
    // The modules beside the configuration, as a user copies them (a module may only refer
    // to its siblings within one package).
    for module in ["cluster", "node-pool"] {
        let into = terraform.dir().join("modules").join(module);
        std::fs::create_dir_all(&into)?;
        std::fs::copy(modules.join(module).join("main.tf"), into.join("main.tf"))?;
    }
    terraform.ok(&["init", "-input=false"], &[])?;
    let started = Instant::now();
    let applied = terraform.ok(
        &["apply", "-auto-approve", "-no-color", "-input=false"],
        &[],
    )?;
    eprintln!(
        "terraform: apply applied in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    // Where the time goes, resource by resource (Terraform's own figures).
    for line in applied
        .lines()
        .filter(|l| l.contains("Creation complete after"))
    {
        eprintln!("terraform:   {line}");
    }
    let vpc_id = terraform.ok(&["output", "-raw", "vpc_id"], &[])?;
    let vpcs = aws.call(
        "ec2",
        "describe_vpcs",
        serde_json::json!({"VpcIds": [vpc_id.trim()]}),
    )?;
    ensure!(
        vpcs["Vpcs"].as_array().is_some_and(|v| v.len() == 1),
        "the module's VPC is in LocalStack: {vpcs}"
    );
    let kubeconfig = terraform.dir().join("out.kubeconfig");
    std::fs::write(
        &kubeconfig,
        terraform.ok(&["output", "-raw", "kubeconfig"], &[])?,
    )?;
    // kubectl runs `flotilla cluster token` for its credential, as a user's would.
    let kubectl = flotilla_e2e::Kubectl::new(&kubeconfig);
    let bin_dir = flotilla_e2e::flotilla_bin()?
        .parent()
        .map(|dir| dir.display().to_string())
        .unwrap_or_default();
    let path = format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default());
    let config_text = config.display().to_string();
    let env = [
        ("PATH", path.as_str()),
        ("FLOTILLA_CONFIG", config_text.as_str()),
    ];
    let jsonpath =
        r#"jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}"#;
    let mut last = String::new();
    flotilla_e2e::until(
        "the pool's 2 Nodes are Ready",
        Duration::from_secs(120),
        || {
            let out = kubectl.run(&["get", "nodes", "-o", jsonpath], None, &env)?;
            last = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(last.split_whitespace().filter(|s| *s == "True").count() == 2)
        },
    )
    .with_context(|| format!("kubectl said: {last}"))?;
    eprintln!(
        "terraform: apply of the cluster module (VPC, subnets, routes, security group, cluster, 2-node pool) → 2 Nodes Ready: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (code, text) = plan(&terraform)?;
    ensure!(code == 0, "a second plan shows no changes:\n{text}");

    // A second pool (the node-pool module again) of an instance type EC2 does not have:
    // the apply fails with the cloud's own message, and the pool stays in the state (tainted)
    // for destroy to remove.
    terraform.write(&format!(
        "{main_tf}\nmodule \"bad_pool\" {{\n  source         = \"./modules/node-pool\"\n  cluster_name   = module.cluster.cluster_name\n  name           = \"bad\"\n  instance_types = [\"m9.huge\"]\n  desired_size   = 1\n  max_size       = 1\n  subnet_ids     = module.cluster.private_subnet_ids\n}}\n"
    ))?;
    terraform.ok(&["init", "-input=false"], &[])?;
    let refused = terraform.fails(&["apply", "-auto-approve", "-input=false"], &[])?;
    ensure!(
        refused.contains("node pool bad is DEGRADED")
            && refused.contains("Ec2InstanceTypeDoesNotExist")
            && refused.contains("m9.huge"),
        "a pool of an unknown instance type fails with the cloud's message: {refused}"
    );
    let listed = terraform.ok(&["state", "list"], &[])?;
    ensure!(
        listed.contains("module.bad_pool.flotilla_node_pool.this"),
        "the failed pool is in the state: {listed}"
    );

    terraform.ok(&["destroy", "-auto-approve", "-input=false"], &[])?;
    let vpcs = aws.try_call(
        "ec2",
        "describe_vpcs",
        serde_json::json!({"VpcIds": [vpc_id.trim()]}),
    )?;
    ensure!(
        vpcs.is_err()
            || vpcs
                .as_ref()
                .is_ok_and(|v| v["Vpcs"].as_array().is_none_or(|a| a.is_empty())),
        "the VPC is gone: {vpcs:?}"
    );
    let running = aws.call(
        "ec2",
        "describe_instances",
        serde_json::json!({"Filters": [{"Name": "instance-state-name", "Values": ["pending", "running"]}]}),
    )?;
    ensure!(
        running["Reservations"].as_array().is_none_or(|r| r
            .iter()
            .all(|r| r["Instances"].as_array().is_none_or(|i| i.is_empty()))),
        "no instance is left: {running}"
    );
    let gateways = aws.call(
        "ec2",
        "describe_nat_gateways",
        serde_json::json!({"Filter": [{"Name": "state", "Values": ["pending", "available"]}]}),
    )?;
    ensure!(
        gateways["NatGateways"]
            .as_array()
            .is_none_or(|g| g.is_empty()),
        "no NAT gateway is left: {gateways}"
    );
    let balancers = aws.call("elbv2", "describe_load_balancers", serde_json::json!({}))?;
    ensure!(
        balancers["LoadBalancers"]
            .as_array()
            .is_none_or(|b| b.is_empty()),
        "no load balancer is left: {balancers}"
    );
    let volumes = aws.call("ec2", "describe_volumes", serde_json::json!({"Filters": [{"Name": "status", "Values": ["available", "in-use", "creating"]}]}))?;
    ensure!(
        volumes["Volumes"].as_array().is_none_or(|v| v.is_empty()),
        "no volume is left: {volumes}"
    );
    Ok(())
}
