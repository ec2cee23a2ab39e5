//! Which reset types a System allows: the Reset action's inline
//! `ResetType@Redfish.AllowableValues` when it is usable, else its `@Redfish.ActionInfo`
//! (`Parameters[Name=ResetType].AllowableValues`), else "not advertised" (try, and let a 400
//! decide).
//!
//! Firmware gets the inline list wrong: Supermicro X12 advertises
//! `GracefulShutdownGracefulRestart`, two values run together, next to an ActionInfo. A list
//! holding a value that is no ResetType is not trusted.

use reqwest::Method;
use serde::Deserialize;

use super::{RedfishDriver, ResetAction};
use crate::error::BmcError;

/// Every value of DSP0266's ResetType enumeration.
pub(super) const KNOWN_RESET_TYPES: &[&str] = &[
    "On",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "Nmi",
    "ForceOn",
    "PushPowerButton",
    "PowerCycle",
    "Suspend",
    "Pause",
    "Resume",
    "FullPowerCycle",
];

#[derive(Debug, Deserialize)]
struct ActionInfo {
    #[serde(rename = "Parameters", default)]
    parameters: Vec<ActionParameter>,
}

#[derive(Debug, Deserialize)]
struct ActionParameter {
    #[serde(rename = "Name")]
    name: Option<String>,
    #[serde(rename = "AllowableValues")]
    allowable_values: Option<Vec<String>>,
}

/// Whether an inline list can be trusted: every value is a ResetType.
pub(super) fn is_well_formed(list: &[String]) -> bool {
    list.iter()
        .all(|value| KNOWN_RESET_TYPES.contains(&value.as_str()))
}

impl RedfishDriver {
    /// The System's allowed reset types; `None` when the BMC does not (usably) say.
    pub(super) async fn allowed_reset_types(
        &self,
        action: Option<&ResetAction>,
    ) -> Result<Option<Vec<String>>, BmcError> {
        let Some(action) = action else {
            return Ok(None);
        };
        let inline = action.allowable_values.as_deref();
        if let Some(list) = inline
            && is_well_formed(list)
        {
            return Ok(Some(list.to_vec()));
        }
        if let Some(info_path) = action.action_info.as_deref() {
            match self.action_info_values(info_path).await {
                Ok(Some(values)) => return Ok(Some(values)),
                Ok(None) => {}
                // The ActionInfo is missing or unreadable (HTTP 4xx, not JSON): not advertised.
                Err(BmcError::Http { status, .. }) if (400..500).contains(&status) => {}
                Err(BmcError::InvalidResponse { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if inline.is_some() {
            tracing::info!(
                endpoint = %self.endpoint,
                "the BMC's ResetType@Redfish.AllowableValues holds values that are no ResetType \
                 and no ActionInfo says better; trying reset types unchecked"
            );
        }
        Ok(None)
    }

    async fn action_info_values(&self, path: &str) -> Result<Option<Vec<String>>, BmcError> {
        let reply = self.exchange(Method::GET, path, None, true).await?;
        let info: ActionInfo = self.parse(path, &reply.body)?;
        Ok(info
            .parameters
            .into_iter()
            .find(|p| p.name.as_deref() == Some("ResetType"))
            .and_then(|p| p.allowable_values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_with_values_that_are_no_reset_type_are_not_trusted() {
        let list = |values: &[&str]| values.iter().map(|v| v.to_string()).collect::<Vec<_>>();
        assert!(is_well_formed(&list(&[
            "On",
            "ForceOff",
            "GracefulShutdown"
        ])));
        assert!(is_well_formed(&[]));
        assert!(!is_well_formed(&list(&[
            "On",
            "ForceOff",
            "GracefulShutdownGracefulRestart"
        ])));
        assert!(!is_well_formed(&list(&["On", "Off"])));
    }
}
