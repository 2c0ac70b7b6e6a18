//! An error printed on one line with its causes, as Go's `%+v` prints a wrapped error: how the
//! CLI, the cloud controller and nodes report transport failures whose top message alone
//! (hyper's "client error", tonic's "transport error") says nothing.

/// `err: cause: cause…`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("client error")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn causes_follow_the_message() {
        let err = Wrapped(std::io::Error::other("connection refused"));
        assert_eq!(error_chain(&err), "client error: connection refused");
    }
}
