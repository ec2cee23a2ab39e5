//! `hostcycle reboot-queue` (`hostcycle rq`): the administrator's view of the reboot queue.
//!
//! Queue users write `RebootQueueEntry.spec`, administrators `RebootQueue.spec`; the controller
//! writes status. The one status write here is `reset-backoff`, made with a resourceVersion
//! precondition like the controller's own, so neither side loses the other's write.
//!
//! - [`add`]: reads names, addresses and node lists, refuses nodes already queued, queues
//!   the rest; [`targets`] resolves names and addresses to Nodes (pure).
//! - [`index`]: hands out indices by creating entries named after them (nothing written on
//!   the `RebootQueue`: queue users need no write on it).
//! - [`entries`]: list, cancel, cancel-all, reset-backoff.
//! - [`switch`]: enable, disable, is-enabled.
//! - [`wait`]: progress until the queue is empty.
//! - [`plan`]: what the controller would do now, online or from a `kubectl get` dump.
//! - [`output`]: tables, JSON and YAML, and CKE's JSON.

mod add;
mod entries;
mod index;
mod output;
mod plan;
mod switch;
mod targets;
mod wait;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use hostcycle_api::queue::RebootQueueEntry;
use hostcycle_operator::cluster::errors::{
    is_already_exists, is_conflict, is_missing_resource_type, is_object_not_found,
};
use kube::Client;
use kube::api::{Api, ListParams};

/// `hostcycle reboot-queue …`
#[derive(Debug, Args)]
pub struct RebootQueueArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, then in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    pub command: RebootQueueCommand,
}

#[derive(Debug, Subcommand)]
pub enum RebootQueueCommand {
    /// Queue nodes for a graceful reboot (cordon, drain, reboot, uncordon), in the order
    /// given.
    ///
    /// Each argument is a Node name, a Node address (InternalIP, ExternalIP or Hostname, as
    /// CKE queues IPs), or a node list: `-` (stdin) or an existing file, as `ckecli
    /// reboot-queue add FILE`. A list holds names and addresses separated by spaces, tabs or
    /// newlines; `#` starts a comment.
    ///
    /// An address that matches no Node or several, a name several Nodes answer to, or an
    /// argument that is both a file and a Node, refuses the whole command: nothing is
    /// queued. Names that are not Nodes, and nodes that already have an entry that is not
    /// cancelled, are reported on stderr and not queued; the others are still queued, and
    /// the exit status is non-zero.
    Add(AddArgs),
    /// List the entries, in queue order (by index).
    List(ListArgs),
    /// Cancel entries, by index or node name: a draining node is uncordoned and not
    /// rebooted; a node already rebooting finishes its reboot.
    ///
    /// Numbers are indexes; anything else is a node name (every entry of that node is
    /// cancelled). Unknown ones are reported and make the exit status non-zero.
    Cancel(CancelArgs),
    /// Cancel every entry.
    CancelAll,
    /// Let the queue start new drains (sets spec.enabled of RebootQueue `default`).
    Enable,
    /// Stop the queue from starting new drains; drains in progress stop and go back to the
    /// queue, reboots in progress finish.
    Disable,
    /// Print `true` or `false`: whether the queue may start drains (no RebootQueue object,
    /// or no spec.enabled, is `true`).
    IsEnabled,
    /// Clear the drain backoff of every entry, so failed drains are tried again at once.
    ResetBackoff,
    /// Show progress until the queue is empty: one line whenever an entry's phase or
    /// message changes.
    ///
    /// Exits 0 once no entry is left, non-zero (naming what is still queued) when the
    /// timeout passes first.
    Wait(WaitArgs),
    /// Print what the controller would do now, and why each waiting entry waits.
    Plan(PlanArgs),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// Node names or addresses, or node lists (`-`: stdin, or an existing file), queued in
    /// this order.
    #[arg(value_name = "NODE|ADDRESS|FILE|-", required_unless_present = "file")]
    pub nodes: Vec<String>,
    /// Always read FILE as a node list (`-`: stdin): names and addresses separated by
    /// spaces, tabs or newlines, `#` comments; at most 1 MiB. Queued after the arguments.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Output format. `cke`: JSON as `ckecli reboot-queue list` prints it (CKE's field
    /// names and statuses; see docs/ckecli.md).
    #[arg(short = 'o', long, value_enum, default_value_t = ListFormat::Table)]
    pub output: ListFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ListFormat {
    Table,
    Json,
    Yaml,
    /// JSON in CKE's shape (`index` as a string, `status`, snake_case fields).
    Cke,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// Entry indexes or node names.
    #[arg(value_name = "INDEX|NODE", required = true)]
    pub targets: Vec<String>,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Give up after this long (e.g. 90s, 30m, 2h; at most 365 days).
    #[arg(long, default_value = "1h", value_parser = hostcycle_bmc::deadline::parse_duration_flag)]
    pub timeout: jiff::SignedDuration,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Plan from this file instead of the API server: the output of `kubectl get
    /// nodes,rebootqueueentries,rebootqueues -o yaml` (or `-o json`, or one object; `-`:
    /// stdin). Needs no cluster. Nodes are not mapped to BareMetalHosts offline, so a
    /// node that could not be rebooted is not reported as such.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Plan as of this time (RFC 3339, e.g. 2026-03-02T12:00:00Z; default: now).
    #[arg(long, value_name = "RFC3339")]
    pub now: Option<jiff::Timestamp>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = PlanFormat::Table)]
    pub output: PlanFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlanFormat {
    Table,
    Json,
}

/// Runs a `hostcycle reboot-queue` command. A Kubernetes client is built only for commands
/// that talk to the API server (`plan --from` needs none).
pub async fn run(args: RebootQueueArgs) -> anyhow::Result<()> {
    let kubeconfig = args.kubeconfig.as_deref();
    match args.command {
        RebootQueueCommand::Plan(plan_args) if plan_args.from.is_some() => {
            plan::run_offline(&plan_args)
        }
        RebootQueueCommand::Plan(plan_args) => {
            plan::run_online(&client(kubeconfig).await?, &plan_args).await
        }
        RebootQueueCommand::Add(add_args) => add::run(&client(kubeconfig).await?, &add_args).await,
        RebootQueueCommand::List(list_args) => {
            entries::list(&client(kubeconfig).await?, list_args.output).await
        }
        RebootQueueCommand::Cancel(cancel_args) => {
            entries::cancel(&client(kubeconfig).await?, &cancel_args.targets).await
        }
        RebootQueueCommand::CancelAll => entries::cancel_all(&client(kubeconfig).await?).await,
        RebootQueueCommand::Enable => switch::set_enabled(&client(kubeconfig).await?, true).await,
        RebootQueueCommand::Disable => switch::set_enabled(&client(kubeconfig).await?, false).await,
        RebootQueueCommand::IsEnabled => switch::is_enabled(&client(kubeconfig).await?).await,
        RebootQueueCommand::ResetBackoff => {
            entries::reset_backoff(&client(kubeconfig).await?).await
        }
        RebootQueueCommand::Wait(wait_args) => {
            let timeout =
                Duration::try_from(wait_args.timeout).context("--timeout must not be negative")?;
            wait::run(&client(kubeconfig).await?, timeout).await
        }
    }
}

async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    crate::kube_client(kubeconfig).await
}

/// An API error as one sentence: what failed, what the server said, and what to do.
pub(crate) fn api_error(e: kube::Error, what: impl std::fmt::Display) -> anyhow::Error {
    match e {
        kube::Error::Api(status) => {
            let hint = if status.code == 404 && is_missing_resource_type(&status.message) {
                "; are hostcycle's CRDs installed? (`hostcycle crd | kubectl apply -f -`)"
            } else if status.code == 401 {
                "; the credentials in the kubeconfig were refused (set --kubeconfig or KUBECONFIG)"
            } else if status.code == 403 {
                "; your user lacks the permission (ask for RBAC on hostcycle.io resources)"
            } else {
                ""
            };
            let reason = if status.reason.is_empty() {
                String::new()
            } else {
                format!(" {}", status.reason)
            };
            anyhow::anyhow!(
                "{what}: the API server answered {}{reason}: {}{hint}",
                status.code,
                status.message
            )
        }
        other => anyhow::anyhow!(
            "{what}: cannot reach the API server ({other}); check that the cluster is up, \
             or set --kubeconfig or KUBECONFIG"
        ),
    }
}

/// A random delay before retrying a write that lost a race: up to `base × 2^attempt`
/// (capped), at least a few milliseconds, so many writers spread out.
pub(crate) fn jittered_delay(attempt: u32) -> Duration {
    use rand::Rng;
    let cap_ms = 25u64 << attempt.min(4);
    Duration::from_millis(rand::rng().random_range(5..=cap_ms))
}

/// Every entry, sorted by index (then name).
pub(crate) async fn list_entries(client: &Client) -> Result<Vec<RebootQueueEntry>, kube::Error> {
    let mut entries = Api::<RebootQueueEntry>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    sort_entries(&mut entries);
    Ok(entries)
}

pub(crate) fn sort_entries(entries: &mut [RebootQueueEntry]) {
    entries.sort_by(|a, b| {
        a.spec
            .index
            .cmp(&b.spec.index)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

/// `entry 3 worker-1`, how entries are named in messages.
pub(crate) fn describe(entry: &RebootQueueEntry) -> String {
    format!("entry {} {}", entry.spec.index, entry.spec.node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_is_bounded_and_grows() {
        for attempt in 0..10 {
            let d = jittered_delay(attempt);
            assert!(d >= Duration::from_millis(5));
            assert!(d <= Duration::from_millis(25 << attempt.min(4)));
        }
    }
}
