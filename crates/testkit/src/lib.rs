//! Starts and stops the real parts hostcycle is tested against: a Kubernetes control plane
//! (etcd + kube-apiserver + kube-controller-manager + kube-scheduler), BMC emulators and the
//! node simulator. Used by end-to-end tests and by `hostcycle lab`.

pub mod bmc_emulators;
pub mod cluster;
pub mod http;
pub mod pki;
pub mod process;
pub mod redfish_stub;

pub use process::{
    ManagedProcess, cache_dir, ensure_port_free, free_port, free_udp_port, require_program,
    venv_bin, wait_until,
};

pub use cluster::{ClusterOptions, LocalCluster, client_from_kubeconfig};

use std::path::PathBuf;
use std::time::Duration;

/// What went wrong while starting or driving a test component.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error(
        "{component}: required program {path} is missing; run `scripts/install-prereqs.sh` (or `make test`) to install it"
    )]
    MissingBinary { component: String, path: PathBuf },
    #[error("{component}: could not start {program}: {source}")]
    Spawn {
        component: String,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{component}: loopback port {port} is already in use; stop whatever holds it or pick another port"
    )]
    PortInUse { component: String, port: u16 },
    #[error("{component} exited early ({status}); its log is {log}:\n{log_tail}", log = .log.display())]
    ComponentExited {
        component: String,
        status: String,
        log: PathBuf,
        log_tail: String,
    },
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {message}")]
    Other { what: String, message: String },
}
