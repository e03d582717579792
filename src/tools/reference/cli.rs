//! The command-line reference: `metahook --help` and each subcommand's long help, as clap renders them
//! from [`crate::tools::cli`], and the flags of Metacontroller's command line the hub also reads
//! ([`crate::tools::metacontroller::usage`]).

use super::markdown::generated_by;
use std::fmt::Write as _;

/// The page, `reference/cli.md`.
#[must_use]
pub fn page() -> String {
    // An environment variable set where the page is generated must not show up in it.
    let mut command = crate::tools::cli::command()
        .mut_args(|arg| arg.hide_env_values(true))
        .mut_subcommands(|sub| sub.mut_args(|arg| arg.hide_env_values(true)));
    // Built, the subcommands know their full name (`Usage: metahook run`).
    command.build();
    let mut out = generated_by("the command line's definition (`src/tools/cli.rs`, `src/tools/metacontroller.rs`)");
    out.push_str(
        "\n# Command line\n\n\
         Every command prints this with `--help` (`-h` for a summary). Flags that name an environment \
         variable (`[env: ...]`) read it when the flag is not given.\n\n## `metahook`\n\n",
    );
    out.push_str(&text_block(&command.render_long_help().to_string()));
    let names: Vec<String> =
        command.get_subcommands().map(|sub| sub.get_name().to_owned()).filter(|name| name != "help").collect();
    for name in names {
        let sub = command.find_subcommand_mut(&name).expect("a listed subcommand");
        let help = sub.render_long_help().to_string();
        let _ = write!(out, "\n## `metahook {name}`\n\n{}", text_block(&help));
    }
    out.push_str(
        "\n## Metacontroller's command line\n\n\
         Started as `metacontroller` (the image has the binary at `/usr/bin/metacontroller` too), or as \
         `metahook` with flags and no subcommand, the hub reads Metacontroller's flags, in Go's syntax, \
         instead of the above; see [Switching from Metacontroller](../switching.md#keep-the-manifest-swap-the-image).\n\n",
    );
    out.push_str(&text_block(&crate::tools::metacontroller::usage()));
    out
}

/// `text` as a fenced block, without the trailing blanks clap leaves on empty lines.
fn text_block(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().map(str::trim_end).collect();
    format!("```text\n{}\n```\n", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_has_its_help_and_no_environment_value_leaks() {
        let page = page();
        for name in ["run", "version", "crds", "render", "rbac", "migrate"] {
            assert!(page.contains(&format!("## `metahook {name}`")), "{name} missing");
        }
        assert!(page.contains("--hook-cmd <HOOK_CMD>"), "{page}");
        assert!(page.contains("Usage: metahook run [OPTIONS]"), "subcommands are named in full");
        assert!(page.contains("[env: METAHOOK_WORKERS]"), "env names are shown, values are not:\n{page}");
        assert!(page.contains("-leader-election-id"), "Metacontroller's flags are listed");
    }
}
