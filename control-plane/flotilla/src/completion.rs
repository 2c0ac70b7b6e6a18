//! `flotilla completion SHELL`: the shell completion script of the whole command line.

use clap::CommandFactory;

use crate::Cli;

/// Writes `shell`'s completion script for `flotilla` to `out`.
pub fn write(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut Cli::command(), "flotilla", out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(shell: clap_complete::Shell) -> String {
        let mut out = Vec::new();
        write(shell, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    #[test]
    fn every_shell_completes_the_subcommands_and_their_flags() {
        let bash = script(clap_complete::Shell::Bash);
        assert!(bash.contains("complete -F _flotilla"), "{bash:.200}");
        for word in ["nodepool", "kubeconfig", "--data-dir", "--log-format"] {
            assert!(bash.contains(word), "bash lacks {word}");
        }
        let zsh = script(clap_complete::Shell::Zsh);
        assert!(zsh.starts_with("#compdef flotilla"));
        assert!(zsh.contains("--nodes"));
        let fish = script(clap_complete::Shell::Fish);
        assert!(fish.contains("complete -c flotilla"));
        assert!(fish.contains("-l data-dir"));
    }
}
