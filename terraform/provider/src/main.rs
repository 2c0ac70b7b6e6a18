//! `terraform-provider-flotilla`: Terraform's plugin (protocol 6) for Flotilla, started by
//! `terraform` itself; it prints the go-plugin handshake on stdout and serves until told to
//! stop. Not meant to be run by hand, except `terraform-provider-flotilla docs DIR`, which
//! writes the reference documentation generated from its schemas.

mod account_resource;
mod auth_data_sources;
mod cluster_data_source;
mod cluster_resource;
mod common;
mod docs;
mod node_pool_resource;
mod pod_security;
mod provider;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [command, dir] if command == "docs" => docs::write(std::path::Path::new(dir)),
        [command, ..] if command == "docs" => {
            anyhow::bail!("usage: terraform-provider-flotilla docs DIR")
        }
        _ => tf_provider::serve("flotilla", provider::FlotillaProvider::default()).await,
    }
}
