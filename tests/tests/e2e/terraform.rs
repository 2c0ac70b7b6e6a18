//! Terraform against the real service: the stock `terraform` binary loads
//! `terraform-provider-flotilla` (plugin protocol 6), configured from the client configuration
//! `flotilla up` writes or from the environment alone, reads a cluster with `data
//! "flotilla_cluster"` into outputs, and reports bad input on the attribute that caused it.

use anyhow::ensure;
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
