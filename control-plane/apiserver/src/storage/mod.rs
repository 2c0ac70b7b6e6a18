//! The innermost layer of the API server: what happens to a value on its way into and out of
//! the `Storage` trait (value transformers), and the watch cache in front of it.

pub mod cacher;
pub mod encryption;
pub mod envelope;
