//! The reboot queue's command sets: what `Command` runs comes from the operator's
//! configuration, never from the RebootQueue.
//!
//! Whoever may queue a reboot must be able to write entries, and older versions needed a
//! patch of the RebootQueue for that; RBAC cannot limit what such a writer changes. So the
//! RebootQueue only names a set (`spec.reboot.commands`), and the sets live in ConfigMap
//! [`REBOOT_COMMANDS_CONFIG_MAP`] of the operator's namespace, which only administrators
//! write. Each key is a set's name, each value a small YAML document:
//!
//! ```yaml
//! rebootCommand: [/usr/local/bin/reboot-node]
//! bootCheckCommand: [/usr/local/bin/booted]
//! ```

use std::collections::BTreeMap;

use hostcycle_api::queue::{DEFAULT_COMMAND_SET, REBOOT_COMMANDS_CONFIG_MAP};
use serde::Deserialize;

use crate::text::bounded;

/// Most arguments in one command.
pub const MAX_COMMAND_ARGS: usize = 64;
/// Longest argument.
pub const MAX_ARG_BYTES: usize = 4096;
/// Longest value of one set in the ConfigMap, checked before it is parsed.
pub const MAX_SET_BYTES: usize = 64 * 1024;
/// Longest set name shown in a message.
const SHOWN_NAME_CHARS: usize = 63;

/// One named pair of commands: the node's address is appended to both, the Unix time of the
/// `Rebooting` transition to the boot check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSet {
    pub reboot: Vec<String>,
    pub boot_check: Vec<String>,
}

/// The command sets as the operator last read them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CommandSets {
    /// Not read (an offline plan, a snapshot built from objects alone).
    #[default]
    Unknown,
    /// The ConfigMap does not exist: no command may run.
    Absent,
    /// The ConfigMap's sets by name; an unusable one says why.
    Present(BTreeMap<String, Result<CommandSet, String>>),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawSet {
    reboot_command: Vec<String>,
    boot_check_command: Vec<String>,
}

impl CommandSets {
    /// The sets in a ConfigMap's `data` (`None`: the ConfigMap does not exist).
    pub fn from_config_map_data(data: Option<&BTreeMap<String, String>>) -> Self {
        let Some(data) = data else {
            return CommandSets::Absent;
        };
        CommandSets::Present(
            data.iter()
                .map(|(name, value)| (name.clone(), parse_set(value)))
                .collect(),
        )
    }

    /// The set `name` (`None`: [`DEFAULT_COMMAND_SET`]), or why it cannot run. The reason
    /// names the set and the ConfigMap, never a command: queue users read it.
    pub fn select(&self, name: Option<&str>) -> Result<CommandSet, String> {
        let name = name.unwrap_or(DEFAULT_COMMAND_SET);
        let shown = bounded(name, SHOWN_NAME_CHARS);
        match self {
            CommandSets::Unknown => Err(format!(
                "the operator's command sets are not known here (ConfigMap \
                 {REBOOT_COMMANDS_CONFIG_MAP} in its namespace)"
            )),
            CommandSets::Absent => Err(format!(
                "no reboot commands are configured: an administrator adds command set \
                 \"{shown}\" to ConfigMap {REBOOT_COMMANDS_CONFIG_MAP} in the operator's \
                 namespace"
            )),
            CommandSets::Present(sets) => match sets.get(name) {
                Some(Ok(set)) => Ok(set.clone()),
                Some(Err(why)) => Err(format!(
                    "command set \"{shown}\" in ConfigMap {REBOOT_COMMANDS_CONFIG_MAP} of the \
                     operator's namespace is invalid: {why}"
                )),
                None => Err(format!(
                    "command set \"{shown}\" is not in ConfigMap {REBOOT_COMMANDS_CONFIG_MAP} \
                     of the operator's namespace"
                )),
            },
        }
    }
}

/// One set's YAML, checked: both commands present, a program first, bounded.
fn parse_set(value: &str) -> Result<CommandSet, String> {
    if value.len() > MAX_SET_BYTES {
        return Err(format!("it is longer than {MAX_SET_BYTES} bytes"));
    }
    // The parser's own message may quote the value: queue users read this reason.
    let raw: RawSet = serde_saphyr::from_str(value).map_err(|_| {
        "expected exactly `rebootCommand: [...]` and `bootCheckCommand: [...]`, each a list \
         of strings"
            .to_string()
    })?;
    Ok(CommandSet {
        reboot: check_command("rebootCommand", raw.reboot_command)?,
        boot_check: check_command("bootCheckCommand", raw.boot_check_command)?,
    })
}

fn check_command(field: &str, argv: Vec<String>) -> Result<Vec<String>, String> {
    match argv.first() {
        None => return Err(format!("{field} is empty")),
        Some(program) if program.trim().is_empty() => {
            return Err(format!("{field} names no program"));
        }
        Some(_) => {}
    }
    if argv.len() > MAX_COMMAND_ARGS {
        return Err(format!(
            "{field} has more than {MAX_COMMAND_ARGS} arguments"
        ));
    }
    if argv
        .iter()
        .any(|a| a.len() > MAX_ARG_BYTES || a.contains('\0'))
    {
        return Err(format!(
            "{field} has an argument longer than {MAX_ARG_BYTES} bytes or with a NUL"
        ));
    }
    Ok(argv)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sets(pairs: &[(&str, &str)]) -> CommandSets {
        let data: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        CommandSets::from_config_map_data(Some(&data))
    }

    #[test]
    fn command_sets_table() {
        let good = "rebootCommand: [/bin/reboot-node, -q]\nbootCheckCommand: [/bin/booted]\n";
        let set = CommandSet {
            reboot: vec!["/bin/reboot-node".into(), "-q".into()],
            boot_check: vec!["/bin/booted".into()],
        };
        let huge_arg = format!(
            "rebootCommand: [\"{}\"]\nbootCheckCommand: [b]\n",
            "x".repeat(MAX_ARG_BYTES + 1)
        );
        let many = format!(
            "rebootCommand: [{}]\nbootCheckCommand: [b]\n",
            vec!["a"; MAX_COMMAND_ARGS + 1].join(", ")
        );
        #[rustfmt::skip]
        type Case<'a> = (&'a str, CommandSets, Option<&'a str>, Result<CommandSet, Vec<&'a str>>);
        let cases: Vec<Case> = vec![
            (
                "default set",
                sets(&[("default", good)]),
                None,
                Ok(set.clone()),
            ),
            (
                "named set",
                sets(&[("ssh", good)]),
                Some("ssh"),
                Ok(set.clone()),
            ),
            (
                "unset name reads default, which is missing",
                sets(&[("ssh", good)]),
                None,
                Err(vec![
                    "\"default\" is not in ConfigMap hostcycle-reboot-commands",
                ]),
            ),
            (
                "ConfigMap absent",
                CommandSets::Absent,
                Some("ssh"),
                Err(vec!["no reboot commands are configured", "\"ssh\""]),
            ),
            (
                "not read",
                CommandSets::Unknown,
                None,
                Err(vec!["not known here"]),
            ),
            (
                "missing boot check",
                sets(&[("default", "rebootCommand: [a]\n")]),
                None,
                Err(vec!["\"default\"", "is invalid", "bootCheckCommand"]),
            ),
            (
                "empty reboot command",
                sets(&[("default", "rebootCommand: []\nbootCheckCommand: [b]\n")]),
                None,
                Err(vec!["is invalid: rebootCommand is empty"]),
            ),
            (
                "blank program",
                sets(&[("default", "rebootCommand: [\" \"]\nbootCheckCommand: [b]\n")]),
                None,
                Err(vec!["rebootCommand names no program"]),
            ),
            (
                "unknown field",
                sets(&[(
                    "default",
                    "rebootCommand: [a]\nbootCheckCommand: [b]\nshell: true\n",
                )]),
                None,
                Err(vec!["is invalid"]),
            ),
            (
                "a string, not a list",
                sets(&[(
                    "default",
                    "rebootCommand: reboot now\nbootCheckCommand: [b]\n",
                )]),
                None,
                Err(vec!["is invalid"]),
            ),
            (
                "huge argument",
                sets(&[("default", &huge_arg)]),
                None,
                Err(vec!["longer than 4096 bytes"]),
            ),
            (
                "too many arguments",
                sets(&[("default", &many)]),
                None,
                Err(vec!["more than 64 arguments"]),
            ),
            (
                "huge value",
                sets(&[("default", &"#".repeat(MAX_SET_BYTES + 1))]),
                None,
                Err(vec!["longer than 65536 bytes"]),
            ),
        ];
        for (name, sets, selected, want) in cases {
            let got = sets.select(selected);
            match (&got, &want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{name}"),
                (Err(g), Err(parts)) => {
                    for part in parts {
                        assert!(g.contains(part), "{name}: {g:?} lacks {part:?}");
                    }
                }
                _ => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_reason_never_echoes_a_command_and_clips_the_name() {
        for secret_command in [
            "rebootCommand: [ssh, -i, /secret/key]\nbootCheckCommand: []\n",
            "rebootCommand: ssh -i /secret/key\nbootCheckCommand: [b]\n",
            "rebootCommand: [ssh]\nbootCheckCommand: [b]\n/secret/key: 1\n",
        ] {
            let why = sets(&[("default", secret_command)])
                .select(None)
                .unwrap_err();
            assert!(!why.contains("/secret/key"), "{why}");
        }
        let long = "n".repeat(500);
        let why = CommandSets::Absent.select(Some(&long)).unwrap_err();
        assert!(why.len() < 300, "{why}");
    }
}
