//! The innermost layer of the API server: what happens to a value on its way into and out of
//! the `Storage` trait (value transformers).

pub mod envelope;
