//! Flotilla's cloud controller: the provider traits ([`provider`]), their AWS implementation
//! ([`aws`], the only code that links the AWS SDK), and the per-cluster controllers that run
//! as pure API clients of the tenant API, beside the scheduler and the controller-manager.

pub mod aws;
pub mod config;
pub mod provider;
