//! `enable`, `disable` and `is-enabled`: `spec.enabled` of RebootQueue `default`.

use hostcycle_api::queue::{REBOOT_QUEUE_NAME, RebootQueue, RebootQueueSpec};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{api_error, is_already_exists, is_object_not_found};

/// How many times a lost create/delete race is retried.
const ATTEMPTS: u32 = 5;

fn word(enabled: bool) -> &'static str {
    if enabled { "enabled" } else { "disabled" }
}

/// Runs `enable` / `disable`: a merge patch of `spec.enabled`, or a new RebootQueue when
/// there is none.
pub async fn set_enabled(client: &Client, enabled: bool) -> anyhow::Result<()> {
    let queues: Api<RebootQueue> = Api::all(client.clone());
    let patch = json!({ "spec": { "enabled": enabled } });
    let what = format!("setting spec.enabled of RebootQueue {REBOOT_QUEUE_NAME} to {enabled}");
    for _ in 0..ATTEMPTS {
        match queues
            .patch(
                REBOOT_QUEUE_NAME,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                println!("the reboot queue is {}", word(enabled));
                return Ok(());
            }
            Err(e) if is_object_not_found(&e) => {}
            Err(e) => return Err(api_error(e, what)),
        }
        let queue = RebootQueue::new(
            REBOOT_QUEUE_NAME,
            RebootQueueSpec {
                enabled: Some(enabled),
                ..RebootQueueSpec::default()
            },
        );
        match queues.create(&PostParams::default(), &queue).await {
            Ok(_) => {
                println!(
                    "the reboot queue is {} (created RebootQueue {REBOOT_QUEUE_NAME})",
                    word(enabled)
                );
                return Ok(());
            }
            // Created by someone else meanwhile: patch it.
            Err(e) if is_already_exists(&e) => {}
            Err(e) => return Err(api_error(e, what)),
        }
    }
    anyhow::bail!(
        "{what}: RebootQueue {REBOOT_QUEUE_NAME} kept appearing and disappearing; \
         is something deleting it? Try again."
    )
}

/// Runs `is-enabled`: prints `true` or `false`.
pub async fn is_enabled(client: &Client) -> anyhow::Result<()> {
    // Not `get_opt`: a missing CRD is an error here, not an absent queue.
    let enabled = match Api::<RebootQueue>::all(client.clone())
        .get(REBOOT_QUEUE_NAME)
        .await
    {
        Ok(queue) => queue.spec.enabled.unwrap_or(true),
        Err(e) if is_object_not_found(&e) => true,
        Err(e) => {
            return Err(api_error(
                e,
                format!("reading RebootQueue {REBOOT_QUEUE_NAME}"),
            ));
        }
    };
    println!("{enabled}");
    Ok(())
}
