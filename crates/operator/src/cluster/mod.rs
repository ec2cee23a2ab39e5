//! One shared view of the cluster for the three controllers: one watch and one cache per
//! kind, whichever controllers read it.
//!
//! [`ClusterView::new`] is built once by [`crate::run`], before the controllers start, with
//! the watches the selected controllers need: BareMetalHosts for any of them (in `--namespace`
//! when it is set); Nodes, Machines (one watch per kind discovery finds),
//! HostRemediations, RebootQueueEntries and RebootQueues for the reboot queue and
//! remediation (and, but Machines, for the health check, which also reads HostHealthChecks and
//! the Leases in `kube-node-lease`). Each controller then subscribes to the kinds it reads, with its own relevance
//! filter and wake-up ([`watch::Feed`]), and [`ClusterView::start`] starts the watches: no
//! event is missed by a controller, and no controller module imports another's.
//!
//! What the host controller watches alone (the metadata of Secrets) stays in its module.

pub mod errors;
pub mod objects;
pub mod watch;

use hostcycle_api::BareMetalHost;
use hostcycle_api::health::{HostHealthCheck, NODE_LEASE_NAMESPACE};
use hostcycle_api::queue::{REBOOT_COMMANDS_CONFIG_MAP, RebootQueue, RebootQueueEntry};
use hostcycle_api::remediation::HostRemediation;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;

use crate::ControllerName;
use watch::{Feed, Starter, Watched};

/// Which kinds a set of controllers reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Kinds {
    /// BareMetalHosts: every controller.
    pub hosts: bool,
    /// Nodes, Machines, HostRemediations, RebootQueueEntries and RebootQueues: the reboot
    /// queue and remediation (each reads all of them).
    pub loops: bool,
    /// The health check: HostHealthChecks, the Leases in `kube-node-lease`, and Nodes,
    /// HostRemediations, RebootQueueEntries and RebootQueues.
    pub health: bool,
}

impl Kinds {
    /// What the reboot queue and remediation each read: every kind but the health check's.
    pub const LOOPS: Kinds = Kinds {
        hosts: true,
        loops: true,
        health: false,
    };

    /// What the health check reads.
    pub const HEALTH: Kinds = Kinds {
        hosts: false,
        loops: false,
        health: true,
    };

    pub fn for_controllers(controllers: &[ControllerName]) -> Kinds {
        Kinds {
            hosts: controllers
                .iter()
                .any(|c| !matches!(c, ControllerName::HealthCheck)),
            loops: controllers
                .iter()
                .any(|c| matches!(c, ControllerName::RebootQueue | ControllerName::Remediation)),
            health: controllers.contains(&ControllerName::HealthCheck),
        }
    }

    /// Nodes, HostRemediations, RebootQueueEntries and RebootQueues.
    fn shared(self) -> bool {
        self.loops || self.health
    }
}

/// One feed per watched kind (see the module's comment). A feed of a kind the selected
/// controllers do not read is never started: it stays empty and never listed.
pub struct ClusterView {
    pub hosts: Feed<BareMetalHost>,
    pub nodes: Feed<Node>,
    /// One per `Machine` kind the server serves (none without the reboot queue and
    /// remediation).
    pub machines: Vec<(ApiResource, Feed<DynamicObject>)>,
    pub remediations: Feed<HostRemediation>,
    pub entries: Feed<RebootQueueEntry>,
    pub queues: Feed<RebootQueue>,
    /// The annotation flow's records: ConfigMaps in the operator's namespace with the record
    /// label (remediation only).
    pub flow_records: Feed<ConfigMap>,
    /// The reboot queue's command sets: ConfigMap `hostcycle-reboot-commands` in the
    /// operator's namespace (reboot queue only).
    pub reboot_commands: Feed<ConfigMap>,
    /// The kubelets' Leases in `kube-node-lease` (health check only).
    pub node_leases: Feed<Lease>,
    /// HostHealthChecks (health check only).
    pub health_checks: Feed<HostHealthCheck>,
    host_namespace: Option<String>,
    /// The client the watches read through, which the controllers write with.
    client: Client,
    /// What the started watches cover.
    watched: Vec<String>,
    /// The watches to start.
    starters: Vec<Starter>,
}

impl ClusterView {
    /// The feeds of `kinds`, not started yet. Finds the Machine kinds by discovery when the
    /// loops need them.
    pub async fn new(
        client: &Client,
        kinds: Kinds,
        host_namespace: Option<String>,
        operator_namespace: &str,
    ) -> Self {
        let machine_resources = if kinds.loops {
            objects::machine_resources(client).await
        } else {
            Vec::new()
        };
        let mut starters = Vec::new();
        let host_api: Api<BareMetalHost> = match &host_namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let hosts = keep(
            &mut starters,
            kinds.hosts,
            Feed::watch(
                host_api,
                Watched::in_namespace("baremetalhosts.metal3.io", host_namespace.as_ref()),
            ),
        );
        let nodes = keep(
            &mut starters,
            kinds.shared(),
            Feed::watch(Api::all(client.clone()), Watched::all("nodes")),
        );
        let machines = machine_resources
            .into_iter()
            .map(|resource| {
                let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                let watched = Watched::all(&resource.plural);
                let machines = keep(
                    &mut starters,
                    kinds.loops,
                    Feed::watch_with(api, resource.clone(), watched),
                );
                (resource, machines)
            })
            .collect();
        let remediations = keep(
            &mut starters,
            kinds.shared(),
            Feed::watch(Api::all(client.clone()), Watched::all("hostremediations")),
        );
        let entries = keep(
            &mut starters,
            kinds.shared(),
            Feed::watch(Api::all(client.clone()), Watched::all("rebootqueueentries")),
        );
        let queues = keep(
            &mut starters,
            kinds.shared(),
            Feed::watch(Api::all(client.clone()), Watched::all("rebootqueues")),
        );
        let records_api: Api<ConfigMap> = Api::namespaced(client.clone(), operator_namespace);
        let flow_records = keep(
            &mut starters,
            kinds.loops,
            Feed::watch_selected(
                records_api.clone(),
                crate::remediation::records::selector(),
                Watched::in_namespace("configmaps", Some(&operator_namespace.to_string())),
            ),
        );
        let reboot_commands = keep(
            &mut starters,
            kinds.loops,
            Feed::watch_named(
                records_api,
                REBOOT_COMMANDS_CONFIG_MAP,
                Watched::in_namespace("configmaps", Some(&operator_namespace.to_string())),
            ),
        );
        let node_leases = keep(
            &mut starters,
            kinds.health,
            Feed::watch(
                Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
                Watched::in_namespace("leases", Some(&NODE_LEASE_NAMESPACE.to_string())),
            ),
        );
        let health_checks = keep(
            &mut starters,
            kinds.health,
            Feed::watch(Api::all(client.clone()), Watched::all("hosthealthchecks")),
        );
        ClusterView {
            node_leases,
            health_checks,
            flow_records,
            reboot_commands,
            hosts,
            nodes,
            machines,
            remediations,
            entries,
            queues,
            host_namespace,
            client: client.clone(),
            watched: starters
                .iter()
                .map(|s| s.watched().resource.clone())
                .collect(),
            starters,
        }
    }

    /// Returns once every feed of `kinds` is listed (never, for a kind the view was not built
    /// with). Readiness is learnt from the watch streams, never by waiting on a store.
    pub fn listed(&self, kinds: Kinds) -> impl Future<Output = ()> + Send + 'static {
        let hosts = kinds.hosts.then(|| self.hosts.clone());
        let loops = kinds.loops.then(|| {
            (
                self.nodes.clone(),
                self.machines
                    .iter()
                    .map(|(_, m)| m.clone())
                    .collect::<Vec<_>>(),
                self.remediations.clone(),
                self.entries.clone(),
                self.queues.clone(),
                self.flow_records.clone(),
                self.reboot_commands.clone(),
            )
        });
        let health = kinds.health.then(|| {
            (
                self.nodes.clone(),
                self.remediations.clone(),
                self.entries.clone(),
                self.queues.clone(),
                self.node_leases.clone(),
                self.health_checks.clone(),
            )
        });
        async move {
            if let Some(hosts) = hosts {
                hosts.wait_listed().await;
            }
            if let Some((nodes, remediations, entries, queues, leases, checks)) = health {
                nodes.wait_listed().await;
                remediations.wait_listed().await;
                entries.wait_listed().await;
                queues.wait_listed().await;
                leases.wait_listed().await;
                checks.wait_listed().await;
            }
            if let Some((nodes, machines, remediations, entries, queues, records, commands)) = loops
            {
                nodes.wait_listed().await;
                for m in &machines {
                    m.wait_listed().await;
                }
                remediations.wait_listed().await;
                entries.wait_listed().await;
                queues.wait_listed().await;
                records.wait_listed().await;
                commands.wait_listed().await;
            }
        }
    }

    /// The client the watches read through; the controllers write with it too.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The namespace of the watched hosts; all namespaces when `None`.
    pub fn host_namespace(&self) -> Option<&String> {
        self.host_namespace.as_ref()
    }

    /// What the watches cover (started or about to be), e.g. `baremetalhosts.metal3.io`,
    /// `nodes`, `machines`.
    pub fn watched(&self) -> &[String] {
        &self.watched
    }

    /// Starts the watches. Subscribe first: a subscriber added later misses what came before.
    /// The watches stop when the returned value is dropped.
    pub fn start(&mut self) -> Watches {
        let tasks = self.starters.drain(..).map(Starter::start).collect();
        Watches { tasks }
    }
}

/// Keeps `feed`'s watch to be started when `wanted`.
fn keep<K>(starters: &mut Vec<Starter>, wanted: bool, (feed, start): (Feed<K>, Starter)) -> Feed<K>
where
    K: kube::Resource + 'static,
    K::DynamicType: Eq + std::hash::Hash,
{
    if wanted {
        starters.push(start);
    }
    feed
}

/// The running watches of a [`ClusterView`]; dropping this stops them.
pub struct Watches {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
