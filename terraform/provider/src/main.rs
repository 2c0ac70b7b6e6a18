//! `terraform-provider-flotilla`: Terraform's plugin (protocol 6) for Flotilla, started by
//! `terraform` itself; it prints the go-plugin handshake on stdout and serves until told to
//! stop. Not meant to be run by hand.

mod auth_data_sources;
mod cluster_data_source;
mod cluster_resource;
mod common;
mod node_pool_resource;
mod provider;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tf_provider::serve("flotilla", provider::FlotillaProvider::default()).await
}
