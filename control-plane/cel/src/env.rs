//! The one CEL environment every rule compiles and runs in (upstream's base environment for
//! Kubernetes 1.33): the standard library, cel-go's strings extension and the Kubernetes
//! libraries, built once.

use std::sync::{Arc, LazyLock};

use cel::{Env, extensions};

static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Registering into a fresh standard environment only fails if two libraries declare the
    // same overload, which the unit tests would catch; an environment missing a library still
    // compiles and runs rules, so fall back to what was registered rather than panic.
    let _ = env.add_extension(extensions::strings);
    let _ = crate::library::register(&mut env);
    let _ = crate::comprehensions::register(&mut env);
    Arc::new(env)
});

/// The shared environment.
pub(crate) fn env() -> &'static Arc<Env> {
    &ENV
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_every_library_without_conflicts() {
        let mut env = Env::stdlib();
        assert_eq!(env.add_extension(extensions::strings), Ok(()));
        assert_eq!(crate::library::register(&mut env), Ok(()));
        assert_eq!(crate::comprehensions::register(&mut env), Ok(()));
    }
}
