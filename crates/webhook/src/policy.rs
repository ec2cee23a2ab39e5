//! Who may request power changes (and change a host's BMC or consumer, or pause or detach it)
//! when the allow-list is on.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::review::UserInfo;

/// The operator's ServiceAccount of the standard install (`deploy/`): the reboot queue and
/// remediation add and remove their reboot annotations with it, and the host controller
/// removes the suffixless one once a reboot's power-off is done.
pub fn operator_service_account() -> ServiceAccountName {
    ServiceAccountName {
        namespace: "hostcycle-system".to_string(),
        name: hostcycle_operator::rbac::OPERATOR_NAME.to_string(),
    }
}

/// A ServiceAccount, written `NAMESPACE:NAME` on the command line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceAccountName {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccountName {
    /// The user name the API server gives a token of this ServiceAccount.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl fmt::Display for ServiceAccountName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.namespace, self.name)
    }
}

impl FromStr for ServiceAccountName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let valid = |part: &str| {
            !part.is_empty()
                && part.len() <= 253
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        };
        match text.split_once(':') {
            Some((namespace, name)) if valid(namespace) && valid(name) => Ok(ServiceAccountName {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
            _ => Err(format!(
                "{text:?} is not NAMESPACE:NAME (lower-case names, e.g. hostcycle-system:hostcycle-operator)"
            )),
        }
    }
}

/// The identities that may add, remove or change `reboot.metal3.io` annotations, set
/// `spec.online` to false, change `spec.bmc`, add, remove or change metal3's `paused` and
/// `detached` annotations, and add, change or remove `spec.consumerRef`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    pub users: BTreeSet<String>,
    pub groups: BTreeSet<String>,
    pub service_accounts: BTreeSet<ServiceAccountName>,
}

impl AllowList {
    /// Whether the request's user is listed, by name, by one of its groups or as a
    /// ServiceAccount.
    pub fn allows(&self, user: &UserInfo) -> bool {
        self.users.contains(&user.username)
            || user.groups.iter().any(|g| self.groups.contains(g))
            || self
                .service_accounts
                .iter()
                .any(|sa| sa.username() == user.username)
    }

    /// The list in words, for a denial: `users [a, b], groups [g], ServiceAccounts [ns:sa]`
    /// (at most a few names of each, then how many more).
    pub fn describe(&self) -> String {
        fn list<'a>(names: impl ExactSizeIterator<Item = String> + 'a) -> String {
            const SHOWN: usize = 8;
            let total = names.len();
            let mut shown: Vec<String> = names.take(SHOWN).collect();
            if total > SHOWN {
                shown.push(format!("and {} more", total - SHOWN));
            }
            format!("[{}]", shown.join(", "))
        }
        let mut parts = Vec::new();
        if !self.users.is_empty() {
            parts.push(format!("users {}", list(self.users.iter().cloned())));
        }
        if !self.groups.is_empty() {
            parts.push(format!("groups {}", list(self.groups.iter().cloned())));
        }
        if !self.service_accounts.is_empty() {
            parts.push(format!(
                "ServiceAccounts {}",
                list(self.service_accounts.iter().map(|sa| sa.to_string()))
            ));
        }
        if parts.is_empty() {
            "nobody".to_string()
        } else {
            parts.join(", ")
        }
    }
}

/// What the webhook enforces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// `None`: everyone whose RBAC lets them edit a host may request power changes (values
    /// are still checked). `Some`: only these identities may.
    pub allow: Option<AllowList>,
    /// With an allow-list, also restrict setting `spec.bmc` on a create: only listed
    /// identities may then create hosts with a BMC. Off by default: creating a host is how
    /// hosts are enrolled, and RBAC on `create` already says who may.
    pub restrict_bmc_on_create: bool,
    /// With an allow-list, also restrict setting `spec.consumerRef` on a create: only listed
    /// identities may then create hosts already consumed. Off by default, like
    /// [`Self::restrict_bmc_on_create`]: `clusterctl move` and installers create hosts with
    /// their consumer, and RBAC on `create` already says who may.
    pub restrict_consumer_ref_on_create: bool,
}

impl Policy {
    /// Values checked, no allow-list.
    pub fn validate_only() -> Self {
        Policy {
            allow: None,
            restrict_bmc_on_create: false,
            restrict_consumer_ref_on_create: false,
        }
    }

    /// An allow-list of `users`, `groups` and `service_accounts`, plus `default_accounts`
    /// (the operator's own ServiceAccount, so the queue, remediation and the host controller
    /// keep working).
    pub fn allow_list(
        users: impl IntoIterator<Item = String>,
        groups: impl IntoIterator<Item = String>,
        service_accounts: impl IntoIterator<Item = ServiceAccountName>,
        default_accounts: impl IntoIterator<Item = ServiceAccountName>,
    ) -> Self {
        Policy {
            allow: Some(AllowList {
                users: users.into_iter().collect(),
                groups: groups.into_iter().collect(),
                service_accounts: service_accounts
                    .into_iter()
                    .chain(default_accounts)
                    .collect(),
            }),
            restrict_bmc_on_create: false,
            restrict_consumer_ref_on_create: false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            username: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn service_account_names() {
        let sa: ServiceAccountName = "tenant-a:rebooter".parse().unwrap();
        assert_eq!(sa.username(), "system:serviceaccount:tenant-a:rebooter");
        assert_eq!(sa.to_string(), "tenant-a:rebooter");
        for bad in ["", "x", "ns:", ":sa", "ns/sa", "NS:sa", "ns:sa:x"] {
            assert!(bad.parse::<ServiceAccountName>().is_err(), "{bad:?}");
        }
        assert_eq!(
            operator_service_account().username(),
            "system:serviceaccount:hostcycle-system:hostcycle-operator"
        );
    }

    #[test]
    fn allowed_by_name_group_or_service_account() {
        let list = Policy::allow_list(
            ["alice".to_string()],
            ["power-admins".to_string()],
            ["tenant:rebooter".parse().unwrap()],
            [operator_service_account()],
        )
        .allow
        .unwrap();
        assert!(list.allows(&user("alice", &[])));
        assert!(list.allows(&user("bob", &["system:authenticated", "power-admins"])));
        assert!(list.allows(&user("system:serviceaccount:tenant:rebooter", &[])));
        assert!(list.allows(&user(
            "system:serviceaccount:hostcycle-system:hostcycle-operator",
            &["system:serviceaccounts"]
        )));
        assert!(!list.allows(&user("mallory", &["system:authenticated"])));
        assert!(
            !list.allows(&user("Alice", &[])),
            "names are case-sensitive"
        );
        assert!(!list.allows(&user("system:serviceaccount:tenant:other", &[])));
        assert!(
            !list.allows(&user("tenant:rebooter", &[])),
            "a ServiceAccount is matched by its token's user name only"
        );
        assert_eq!(
            list.describe(),
            "users [alice], groups [power-admins], ServiceAccounts \
             [hostcycle-system:hostcycle-operator, tenant:rebooter]"
        );
    }

    #[test]
    fn long_lists_are_cut() {
        let list = AllowList {
            users: (0..20).map(|i| format!("u{i:02}")).collect(),
            ..Default::default()
        };
        assert_eq!(
            list.describe(),
            "users [u00, u01, u02, u03, u04, u05, u06, u07, and 12 more]"
        );
        assert_eq!(AllowList::default().describe(), "nobody");
    }
}
