//! One watch per kind, shared by every controller that reads it ([`Feed`]), and watches whose
//! cached objects keep only what the controllers read ([`lean_watcher`]).
//!
//! A [`Feed`] is one watch, one cache (a kube reflector [`Store`]) and a list of subscribers.
//! The task that drives the watch fills the cache, then tells each subscriber of the change in
//! its own way: a loop that re-reads the caches on every pass (the reboot queue, remediation)
//! is woken through its `Notify` when its relevance filter wants the object; the host
//! controller, a kube-rs `Controller`, is sent every object the watch touches, as kube's
//! `touched_objects` would. Filters borrow the object; nothing is cloned per subscriber.
//!
//! Whether a feed's first list is through is said by a flag set from the stream
//! ([`Feed::wait_listed`]), never by [`Store::wait_until_ready`]: kube's store wakes only the
//! task that polled it last (its `DelayedInit` is a oneshot receiver), and the host
//! controller's kube runner already waits on the host store. Nothing else may wait on a
//! feed's store.
//!
//! Lean objects: two parts of an object are never read and are often its largest:
//! `metadata.managedFields` (server-side apply's bookkeeping, one entry per writer, rewritten
//! on every status write) and kubectl's last-applied-configuration annotation (a second copy
//! of the object). They are dropped before an object is stored. Writes are unaffected: status
//! is written to the status subresource (the server ignores metadata there) and everything
//! else is patched.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::channel::mpsc;
use futures::{Stream, StreamExt as _};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{Store, reflector};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// kubectl's copy of the last applied object.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// [`watcher`] whose objects lose their managed fields and last-applied annotation.
pub fn lean_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    watcher(api, config).modify(strip_unread_metadata)
}

/// Drops all metadata but the name, namespace, uid and resourceVersion: for the metadata
/// watch of every Secret (`watcher(..).modify(keep_identity_only)`). Whoever may write a
/// Secret may fill its labels and annotations (256 KiB each), which no controller reads from
/// the watch and both replicas would otherwise hold.
pub fn keep_identity_only<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    *meta = kube::api::ObjectMeta {
        name: meta.name.take(),
        namespace: meta.namespace.take(),
        uid: meta.uid.take(),
        resource_version: meta.resource_version.take(),
        ..Default::default()
    };
}

/// Passes a reflector's events on and sets `listed` once the first complete list has gone
/// through (the reflector upstream has then filled its store).
///
/// This is how a controller learns that a store is ready without waiting on it: kube's
/// `Store::wait_until_ready` wakes only the task that polled it last (its `DelayedInit` is a
/// oneshot receiver), and the controller's runner already waits on the store it was given.
/// A second waiter takes that wake-up away and the runner never starts.
pub fn note_listed<K, S>(
    events: S,
    listed: tokio::sync::watch::Sender<bool>,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send
where
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
{
    use futures::StreamExt as _;
    events.inspect(move |event| {
        if let Ok(watcher::Event::InitDone) = event {
            // Once: a re-list after a broken watch says nothing new.
            listed.send_if_modified(|listed| !std::mem::replace(listed, true));
        }
    })
}

/// Drops what no controller reads from a watched object (see the module's comment).
pub fn strip_unread_metadata<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// What a watch covers, for its error messages.
#[derive(Debug, Clone)]
pub struct Watched {
    pub resource: String,
    /// Empty for every namespace (or a cluster-scoped resource).
    pub namespace: String,
}

impl Watched {
    pub fn all(resource: &str) -> Self {
        Watched {
            resource: resource.to_string(),
            namespace: String::new(),
        }
    }

    pub fn in_namespace(resource: &str, namespace: Option<&String>) -> Self {
        Watched {
            resource: resource.to_string(),
            namespace: namespace.cloned().unwrap_or_default(),
        }
    }
}

/// Logs a watch error; the watch retries with backoff. A refusal by RBAC is said in words at
/// warn level: whoever reads the watch is blind until the permission is granted.
pub fn log_watch_error(error: &watcher::Error, watched: &Watched) {
    let text = crate::text::watch_error(error, &watched.resource, &watched.namespace);
    if text.starts_with("forbidden") {
        tracing::warn!(error = %text, "watch refused; retrying with backoff");
    } else {
        tracing::debug!(error = %text, "watch error; retrying with backoff");
    }
}

/// A feed's watch, not started yet. Held by the [`ClusterView`](super::ClusterView) until
/// every controller has subscribed.
pub struct Starter {
    watched: Watched,
    start: Box<dyn FnOnce(Watched) -> JoinHandle<()> + Send>,
}

impl Starter {
    /// What the watch covers.
    pub fn watched(&self) -> &Watched {
        &self.watched
    }

    /// Spawns the task that drives the watch; aborting it stops the watch.
    pub fn start(self) -> JoinHandle<()> {
        (self.start)(self.watched)
    }
}

/// One subscriber of a feed.
enum Subscriber<K> {
    /// Woken when an object it finds relevant was applied, when any object was deleted, and
    /// when a (re-)list is through — as each loop's own watch woke it before the feeds were
    /// shared. `relevant` sees applied objects only (not those of a list).
    Wake {
        wake: Arc<Notify>,
        relevant: Box<dyn FnMut(&K) -> bool + Send>,
    },
    /// Sent every object the watch touches: listed, applied or deleted.
    Touched(mpsc::UnboundedSender<K>),
}

/// One watched kind, shared: its cache, whether its first list is through, and its
/// subscribers (see the module's comment). Cheap to clone.
pub struct Feed<K: Resource + 'static>
where
    K::DynamicType: Eq + Hash,
{
    store: Store<K>,
    listed: watch::Receiver<bool>,
    subscribers: Arc<Mutex<Vec<Subscriber<K>>>>,
}

impl<K: Resource + 'static> Clone for Feed<K>
where
    K::DynamicType: Eq + Hash,
{
    fn clone(&self) -> Self {
        Feed {
            store: self.store.clone(),
            listed: self.listed.clone(),
            subscribers: self.subscribers.clone(),
        }
    }
}

impl<K> Feed<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default + Send + Sync,
{
    /// A lean watch of `api`'s objects; it runs once the returned [`Starter`] is called.
    pub fn watch(api: Api<K>, watched: Watched) -> (Self, Starter) {
        Self::watch_with(api, K::DynamicType::default(), watched)
    }

    /// [`Feed::watch`] of the objects with a label `selector` selects.
    pub fn watch_selected(api: Api<K>, selector: String, watched: Watched) -> (Self, Starter) {
        Self::from_events(K::DynamicType::default(), watched, move |writer| {
            reflector(
                writer,
                lean_watcher(api, watcher::Config::default().labels(&selector)),
            )
        })
    }

    /// [`Feed::watch`] of the one object named `name` (a field selector).
    pub fn watch_named(api: Api<K>, name: &str, watched: Watched) -> (Self, Starter) {
        let fields = format!("metadata.name={name}");
        Self::from_events(K::DynamicType::default(), watched, move |writer| {
            reflector(
                writer,
                lean_watcher(api, watcher::Config::default().fields(&fields)),
            )
        })
    }
}

impl<K> Feed<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    /// [`Feed::watch`] for a kind known at run time (a Machine kind found by discovery).
    pub fn watch_with(api: Api<K>, dyntype: K::DynamicType, watched: Watched) -> (Self, Starter) {
        Self::from_events(dyntype, watched, move |writer| {
            reflector(writer, lean_watcher(api, watcher::Config::default()))
        })
    }

    /// A feed whose cache `events` fills: `events` is given the cache's writer and returns
    /// the reflected stream. The watch's backoff is added here.
    pub fn from_events<S>(
        dyntype: K::DynamicType,
        watched: Watched,
        events: impl FnOnce(Writer<K>) -> S + Send + 'static,
    ) -> (Self, Starter)
    where
        S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    {
        let writer = Writer::new(dyntype);
        let store = writer.as_reader();
        let (listed_tx, listed) = watch::channel(false);
        let subscribers: Arc<Mutex<Vec<Subscriber<K>>>> = Arc::default();
        let feed = Feed {
            store,
            listed,
            subscribers: subscribers.clone(),
        };
        let start = Starter {
            watched,
            start: Box::new(move |watched| {
                let events = events(writer).backoff(crate::backoff::WatchBackoff::default());
                tokio::spawn(fan_out(watched, events, listed_tx, subscribers))
            }),
        };
        (feed, start)
    }

    /// The cache. Never wait on it (see the module's comment): use [`Feed::wait_listed`].
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Whether the first list is through.
    pub fn is_listed(&self) -> bool {
        *self.listed.borrow()
    }

    /// Returns once the first list is through (the cache is filled); never, for a feed whose
    /// watch was not started or has stopped before that.
    pub async fn wait_listed(&self) {
        let mut listed = self.listed.clone();
        // The guard `wait_for` returns is not Send: only whether it happened is kept.
        let done = listed.wait_for(|listed| *listed).await.is_ok();
        if !done {
            std::future::pending::<()>().await;
        }
    }

    /// Notifies `wake` when an applied object is `relevant`, when an object is deleted, and
    /// when a list is through. `relevant` is called on the watch's task and must be quick.
    pub fn wake_on(&self, wake: Arc<Notify>, relevant: impl FnMut(&K) -> bool + Send + 'static) {
        self.subscribers().push(Subscriber::Wake {
            wake,
            relevant: Box::new(relevant),
        });
    }

    /// Every object the watch touches from now on (listed, applied or deleted), as kube's
    /// `touched_objects` yields them. The receiver must be drained: the channel is unbounded.
    pub fn touched(&self) -> mpsc::UnboundedReceiver<K> {
        let (tx, rx) = mpsc::unbounded();
        self.subscribers().push(Subscriber::Touched(tx));
        rx
    }

    fn subscribers(&self) -> MutexGuard<'_, Vec<Subscriber<K>>> {
        lock(&self.subscribers)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// What a watch event means to the subscribers.
enum Change {
    /// An object of a list, before the list is through.
    Listed,
    Applied,
    Deleted,
}

/// Drives a feed's watch (the reflector fills its cache as it is polled) and tells the
/// subscribers of each event.
async fn fan_out<K, S>(
    watched: Watched,
    events: S,
    listed: watch::Sender<bool>,
    subscribers: Arc<Mutex<Vec<Subscriber<K>>>>,
) where
    K: Clone,
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
{
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(object)) => {
                deliver(&mut lock(&subscribers), object, Change::Applied)
            }
            Ok(watcher::Event::Delete(object)) => {
                deliver(&mut lock(&subscribers), object, Change::Deleted)
            }
            Ok(watcher::Event::InitApply(object)) => {
                deliver(&mut lock(&subscribers), object, Change::Listed)
            }
            Ok(watcher::Event::InitDone) => {
                // Once: a re-list after a broken watch says nothing new.
                listed.send_if_modified(|listed| !std::mem::replace(listed, true));
                for subscriber in lock(&subscribers).iter() {
                    if let Subscriber::Wake { wake, .. } = subscriber {
                        wake.notify_one();
                    }
                }
            }
            Ok(watcher::Event::Init) => {}
            Err(e) => log_watch_error(&e, &watched),
        }
    }
}

/// Tells every subscriber of one object's change: the wakers see it borrowed; the object
/// itself goes to the last subscriber that takes objects (a copy to any other).
fn deliver<K: Clone>(subscribers: &mut Vec<Subscriber<K>>, object: K, change: Change) {
    let mut takers = Vec::new();
    for (i, subscriber) in subscribers.iter_mut().enumerate() {
        match subscriber {
            Subscriber::Wake { wake, relevant } => {
                let wake_now = match change {
                    Change::Listed => false,
                    Change::Applied => relevant(&object),
                    Change::Deleted => true,
                };
                if wake_now {
                    wake.notify_one();
                }
            }
            Subscriber::Touched(_) => takers.push(i),
        }
    }
    let mut closed = Vec::new();
    if let Some((&last, others)) = takers.split_last() {
        for &i in others {
            if let Subscriber::Touched(tx) = &subscribers[i]
                && tx.unbounded_send(object.clone()).is_err()
            {
                closed.push(i);
            }
        }
        if let Subscriber::Touched(tx) = &subscribers[last]
            && tx.unbounded_send(object).is_err()
        {
            closed.push(last);
        }
    }
    // A subscriber that stopped reading is forgotten.
    for i in closed.into_iter().rev() {
        subscribers.remove(i);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    /// A tenant's Secret with 256 KiB annotations and labels is held as its identity alone.
    #[test]
    fn secret_metadata_keeps_only_its_identity() {
        use k8s_openapi::api::core::v1::Secret;
        use kube::core::PartialObjectMeta;
        let big = "x".repeat(256 * 1024);
        let mut secret: PartialObjectMeta<Secret> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {
                "name": "bmc", "namespace": "default", "uid": "u-1", "resourceVersion": "7",
                "labels": { "a": "b" },
                "annotations": { "filler": big, "hostcycle.io/bmc-addresses": "10.0.0.1" },
                "ownerReferences": [{ "apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "p" }],
                "finalizers": ["x/y"],
                "managedFields": [{ "manager": "kubectl" }],
            },
        }))
        .unwrap();
        keep_identity_only(&mut secret);
        assert_eq!(
            serde_json::to_value(&secret.metadata).unwrap(),
            json!({ "name": "bmc", "namespace": "default", "uid": "u-1", "resourceVersion": "7" })
        );
    }

    #[tokio::test]
    async fn listed_is_said_once_the_first_list_is_through() {
        use futures::StreamExt as _;
        let (tx, rx) = tokio::sync::watch::channel(false);
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(Node::default())),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(Node::default())),
        ]);
        let mut events = Box::pin(note_listed(events, tx));
        let mut seen = 0;
        while let Some(event) = events.next().await {
            seen += 1;
            // Not before the list's end has gone through, and from then on.
            assert_eq!(*rx.borrow(), seen >= 3, "after event {seen}: {event:?}");
        }
        assert_eq!(seen, 4, "every event is passed on");
    }

    fn node(name: &str, ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": { "name": name, "uid": format!("uid-{name}") },
            "status": { "conditions": [{ "type": "Ready", "status": ready }] },
        }))
        .unwrap()
    }

    /// Whether `wake` was notified since it was last looked at.
    fn woke(wake: &Notify) -> bool {
        use futures::FutureExt as _;
        let notified = wake.notified();
        futures::pin_mut!(notified);
        notified.now_or_never().is_some()
    }

    /// One watch, one cache, three subscribers: two loops with different relevance filters
    /// (each woken only for what it wants, for every deletion and when a list is through)
    /// and a controller sent every object the watch touches.
    #[tokio::test]
    async fn one_watch_tells_each_subscriber_only_what_it_wants() {
        use futures::StreamExt as _;
        use kube::ResourceExt as _;
        let (events, events_rx) =
            futures::channel::mpsc::unbounded::<watcher::Result<watcher::Event<Node>>>();
        let (feed, start) = Feed::<Node>::from_events((), Watched::all("nodes"), move |writer| {
            reflector(writer, events_rx)
        });
        let (wake_a, wake_b) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let asked_a = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let asked = asked_a.clone();
        feed.wake_on(wake_a.clone(), move |n: &Node| {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            n.name_any().starts_with('a')
        });
        feed.wake_on(wake_b.clone(), |n: &Node| n.name_any().starts_with('b'));
        let mut touched = feed.touched();
        let task = start.start();
        let send = |event| events.unbounded_send(Ok(event)).unwrap();
        let mut next_touched = async || touched.next().await.unwrap().name_any();

        // The first list: every object reaches the controller; no loop is woken before the
        // list is through, and the filters are not asked about listed objects.
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(node("a1", "True")));
        send(watcher::Event::InitApply(node("b1", "True")));
        assert_eq!(next_touched().await, "a1");
        assert_eq!(next_touched().await, "b1");
        assert!(!feed.is_listed());
        assert!(!woke(&wake_a) && !woke(&wake_b));
        send(watcher::Event::InitDone);
        feed.wait_listed().await;
        assert!(
            woke(&wake_a) && woke(&wake_b),
            "a list through wakes every loop"
        );
        assert_eq!(
            feed.store().state().len(),
            2,
            "one cache, filled by the one watch"
        );
        assert_eq!(asked_a.load(std::sync::atomic::Ordering::SeqCst), 0);

        // Changes: each loop only for the objects it wants.
        send(watcher::Event::Apply(node("a1", "False")));
        assert_eq!(next_touched().await, "a1");
        assert!(woke(&wake_a) && !woke(&wake_b));
        send(watcher::Event::Apply(node("b1", "False")));
        assert_eq!(next_touched().await, "b1");
        assert!(!woke(&wake_a) && woke(&wake_b));
        send(watcher::Event::Apply(node("c1", "True")));
        assert_eq!(next_touched().await, "c1");
        assert!(!woke(&wake_a) && !woke(&wake_b), "wanted by neither");
        assert_eq!(asked_a.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(
            feed.store()
                .get(&kube::runtime::reflector::ObjectRef::new("a1"))
                .and_then(|n| n.status.clone())
                .and_then(|s| s.conditions)
                .map(|c| c[0].status.clone())
                .as_deref(),
            Some("False"),
            "the cache is current before anyone is told"
        );

        // A deletion wakes every loop, whatever it wants.
        send(watcher::Event::Delete(node("c1", "True")));
        assert_eq!(next_touched().await, "c1");
        assert!(woke(&wake_a) && woke(&wake_b));
        assert_eq!(feed.store().state().len(), 2);

        // A re-list (after a broken watch) wakes them again; `listed` stays said.
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(node("a1", "True")));
        assert_eq!(next_touched().await, "a1");
        send(watcher::Event::InitDone);
        send(watcher::Event::Apply(node("b2", "True")));
        assert_eq!(next_touched().await, "b2");
        assert!(woke(&wake_a) && woke(&wake_b));
        assert!(feed.is_listed());

        // A controller that stopped reading is forgotten; the loops are still told.
        drop(touched);
        send(watcher::Event::Apply(node("a3", "True")));
        let told = tokio::time::timeout(std::time::Duration::from_secs(5), wake_a.notified());
        assert!(told.await.is_ok(), "the loop is still told");
        assert_eq!(feed.subscribers().len(), 2);
        task.abort();
    }

    #[test]
    fn managed_fields_and_last_applied_go_everything_else_stays() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": "n",
                "annotations": {
                    LAST_APPLIED_ANNOTATION: "{\"big\":\"copy\"}",
                    "reboot.metal3.io": "",
                },
                "labels": { "a": "b" },
                "managedFields": [{ "manager": "kubelet", "operation": "Update",
                                    "fieldsType": "FieldsV1", "fieldsV1": { "f:status": {} } }],
            },
            "spec": { "unschedulable": true },
        }))
        .unwrap();
        strip_unread_metadata(&mut node);
        assert_eq!(node.metadata.managed_fields, None);
        let annotations = node.metadata.annotations.clone().unwrap();
        assert_eq!(annotations.len(), 1);
        assert!(annotations.contains_key("reboot.metal3.io"));
        assert_eq!(node.metadata.labels.unwrap()["a"], "b");
        assert_eq!(node.spec.unwrap().unschedulable, Some(true));
    }
}
