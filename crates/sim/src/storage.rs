//! The storage simulator: an in-process ledger of which host each volume is attached to and who
//! wrote to it when. It is the ground truth for "never two writers", independent of hostcycle:
//! the simulated CSI attacher attaches and detaches through it, the simulated hosts' running
//! pods write to it, and tests and benchmarks read [`Ledger::violations`].
//!
//! The ledger itself is pure (every call takes its time); [`StorageSim`] shares one behind a
//! mutex and stamps calls with the wall clock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use jiff::Timestamp;

/// One attachment of a volume to a host, and the writes made through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub host: String,
    pub attached_at: Timestamp,
    /// `None` while still attached.
    pub detached_at: Option<Timestamp>,
    pub first_write: Option<Timestamp>,
    pub last_write: Option<Timestamp>,
    pub writes: u64,
}

/// Consecutive writes from a host the volume was not attached to at the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrayWrites {
    pub host: String,
    pub first: Timestamp,
    pub last: Timestamp,
    pub writes: u64,
}

/// Everything that happened to one volume, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeHistory {
    pub attachments: Vec<Attachment>,
    pub stray_writes: Vec<StrayWrites>,
}

/// A ReadWriteOnce volume attached elsewhere cannot be attached again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "volume {volume} is ReadWriteOnce and attached to host {holder}; refusing to attach it to host {requested}"
)]
pub struct AttachRefused {
    pub volume: String,
    pub holder: String,
    pub requested: String,
}

/// Whether a write went through an attachment of its host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    Attached,
    /// Recorded as a violation: the volume was not attached to the writing host.
    NotAttached,
}

/// A breach of "never two writers".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Two hosts wrote to the volume in overlapping time spans (first write to last write).
    TwoWriters {
        volume: String,
        first_host: String,
        first_span: (Timestamp, Timestamp),
        second_host: String,
        second_span: (Timestamp, Timestamp),
    },
    /// A host wrote to the volume while it was not attached to that host.
    WriteWhileNotAttached {
        volume: String,
        host: String,
        first: Timestamp,
        last: Timestamp,
        writes: u64,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::TwoWriters {
                volume,
                first_host,
                first_span,
                second_host,
                second_span,
            } => write!(
                f,
                "two writers on volume {volume}: {first_host} wrote {} .. {} and {second_host} wrote {} .. {}",
                first_span.0, first_span.1, second_span.0, second_span.1
            ),
            Violation::WriteWhileNotAttached {
                volume,
                host,
                first,
                last,
                writes,
            } => write!(
                f,
                "{writes} write(s) to volume {volume} from host {host} while not attached to it, {first} .. {last}"
            ),
        }
    }
}

/// The pure ledger: attachments and writes per volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    volumes: BTreeMap<String, VolumeHistory>,
}

impl Ledger {
    /// The host `volume` is attached to now, if any.
    pub fn attached_host(&self, volume: &str) -> Option<&str> {
        self.volumes
            .get(volume)?
            .attachments
            .iter()
            .find(|a| a.detached_at.is_none())
            .map(|a| a.host.as_str())
    }

    /// Attaches `volume` to `host`; attaching it again to the same host is a no-op.
    pub fn attach(&mut self, volume: &str, host: &str, at: Timestamp) -> Result<(), AttachRefused> {
        match self.attached_host(volume) {
            Some(holder) if holder == host => return Ok(()),
            Some(holder) => {
                return Err(AttachRefused {
                    volume: volume.to_string(),
                    holder: holder.to_string(),
                    requested: host.to_string(),
                });
            }
            None => {}
        }
        self.volumes
            .entry(volume.to_string())
            .or_default()
            .attachments
            .push(Attachment {
                host: host.to_string(),
                attached_at: at,
                detached_at: None,
                first_write: None,
                last_write: None,
                writes: 0,
            });
        Ok(())
    }

    /// Detaches `volume` from `host`. Returns whether it was attached there.
    pub fn detach(&mut self, volume: &str, host: &str, at: Timestamp) -> bool {
        let Some(history) = self.volumes.get_mut(volume) else {
            return false;
        };
        match history
            .attachments
            .iter_mut()
            .find(|a| a.detached_at.is_none() && a.host == host)
        {
            Some(open) => {
                open.detached_at = Some(at);
                true
            }
            None => false,
        }
    }

    /// Records one write from `host` to `volume`.
    pub fn write(&mut self, volume: &str, host: &str, at: Timestamp) -> WriteOutcome {
        let history = self.volumes.entry(volume.to_string()).or_default();
        if let Some(open) = history
            .attachments
            .iter_mut()
            .find(|a| a.detached_at.is_none() && a.host == host)
        {
            open.first_write.get_or_insert(at);
            open.last_write = Some(at);
            open.writes += 1;
            return WriteOutcome::Attached;
        }
        // Extend the host's latest stray run unless the host was attached since it began.
        let reattached_since = |since: Timestamp| {
            history
                .attachments
                .iter()
                .any(|a| a.host == host && a.attached_at >= since)
        };
        let run = history
            .stray_writes
            .iter()
            .rposition(|r| r.host == host)
            .filter(|&i| !reattached_since(history.stray_writes[i].first));
        match run {
            Some(i) => {
                let r = &mut history.stray_writes[i];
                r.last = r.last.max(at);
                r.writes += 1;
            }
            None => history.stray_writes.push(StrayWrites {
                host: host.to_string(),
                first: at,
                last: at,
                writes: 1,
            }),
        }
        WriteOutcome::NotAttached
    }

    /// Every volume the ledger has seen.
    pub fn volumes(&self) -> impl Iterator<Item = &str> {
        self.volumes.keys().map(String::as_str)
    }

    /// The history of `volume` (empty if never seen).
    pub fn history(&self, volume: &str) -> VolumeHistory {
        self.volumes.get(volume).cloned().unwrap_or_default()
    }

    /// `volume`'s attachments to `host`, as (attached_at, detached_at), oldest first.
    pub fn attach_times(&self, volume: &str, host: &str) -> Vec<(Timestamp, Option<Timestamp>)> {
        self.volumes
            .get(volume)
            .map(|h| {
                h.attachments
                    .iter()
                    .filter(|a| a.host == host)
                    .map(|a| (a.attached_at, a.detached_at))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The last write from `host` to `volume`, attached or not.
    pub fn last_write(&self, volume: &str, host: &str) -> Option<Timestamp> {
        let history = self.volumes.get(volume)?;
        let attached = history
            .attachments
            .iter()
            .filter(|a| a.host == host)
            .filter_map(|a| a.last_write);
        let stray = history
            .stray_writes
            .iter()
            .filter(|r| r.host == host)
            .map(|r| r.last);
        attached.chain(stray).max()
    }

    /// How many writes `host` made to `volume`, attached or not.
    pub fn writes(&self, volume: &str, host: &str) -> u64 {
        self.volumes.get(volume).map_or(0, |h| {
            h.attachments
                .iter()
                .filter(|a| a.host == host)
                .map(|a| a.writes)
                .chain(
                    h.stray_writes
                        .iter()
                        .filter(|r| r.host == host)
                        .map(|r| r.writes),
                )
                .sum()
        })
    }

    /// Every "two writers" overlap and every write from a host the volume was not attached to.
    pub fn violations(&self) -> Vec<Violation> {
        let mut found = Vec::new();
        for (volume, history) in &self.volumes {
            let spans: Vec<(&str, Timestamp, Timestamp)> = history
                .attachments
                .iter()
                .filter_map(|a| Some((a.host.as_str(), a.first_write?, a.last_write?)))
                .chain(
                    history
                        .stray_writes
                        .iter()
                        .map(|r| (r.host.as_str(), r.first, r.last)),
                )
                .collect();
            for (i, a) in spans.iter().enumerate() {
                for b in &spans[i + 1..] {
                    if a.0 != b.0 && a.1 <= b.2 && b.1 <= a.2 {
                        let (first, second) = if a.1 <= b.1 { (a, b) } else { (b, a) };
                        found.push(Violation::TwoWriters {
                            volume: volume.clone(),
                            first_host: first.0.to_string(),
                            first_span: (first.1, first.2),
                            second_host: second.0.to_string(),
                            second_span: (second.1, second.2),
                        });
                    }
                }
            }
            for r in &history.stray_writes {
                found.push(Violation::WriteWhileNotAttached {
                    volume: volume.clone(),
                    host: r.host.clone(),
                    first: r.first,
                    last: r.last,
                    writes: r.writes,
                });
            }
        }
        found
    }
}

/// A shared [`Ledger`] stamped with the wall clock; clones share the same storage.
#[derive(Debug, Clone, Default)]
pub struct StorageSim {
    ledger: Arc<Mutex<Ledger>>,
}

impl StorageSim {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // A panic elsewhere while holding the lock leaves a consistent ledger (every update is
        // a single push or field change), so keep using it.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn attach(&self, volume: &str, host: &str) -> Result<(), AttachRefused> {
        self.lock().attach(volume, host, Timestamp::now())
    }

    pub fn detach(&self, volume: &str, host: &str) -> bool {
        self.lock().detach(volume, host, Timestamp::now())
    }

    pub fn write(&self, volume: &str, host: &str) -> WriteOutcome {
        self.lock().write(volume, host, Timestamp::now())
    }

    pub fn attached_host(&self, volume: &str) -> Option<String> {
        self.lock().attached_host(volume).map(str::to_string)
    }

    /// A copy of the ledger, for assertions and reports.
    pub fn snapshot(&self) -> Ledger {
        self.lock().clone()
    }

    pub fn violations(&self) -> Vec<Violation> {
        self.lock().violations()
    }

    pub fn last_write(&self, volume: &str, host: &str) -> Option<Timestamp> {
        self.lock().last_write(volume, host)
    }

    pub fn writes(&self, volume: &str, host: &str) -> u64 {
        self.lock().writes(volume, host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn read_write_once_refuses_a_second_host() {
        /// name, earlier (host, attach or detach), host to attach, expected (Err: the holder)
        type Case = (
            &'static str,
            Vec<(&'static str, bool)>,
            &'static str,
            Result<(), &'static str>,
        );
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            // name, earlier (host, attach=true/detach=false), host to attach, expected (Err: holder)
            ("first attach",                     vec![], "a", Ok(())),
            ("same host again is a no-op",       vec![("a", true)], "a", Ok(())),
            ("second host refused",              vec![("a", true)], "b", Err("a")),
            ("after detach another host may",    vec![("a", true), ("a", false)], "b", Ok(())),
            ("detach from the wrong host keeps", vec![("a", true), ("b", false)], "b", Err("a")),
        ];
        for (name, earlier, host, want) in cases {
            let mut ledger = Ledger::default();
            for (i, (h, attach)) in earlier.iter().enumerate() {
                if *attach {
                    assert!(ledger.attach("v", h, t(i as i64)).is_ok(), "{name}: setup");
                } else {
                    ledger.detach("v", h, t(i as i64));
                }
            }
            let got = ledger.attach("v", host, t(10)).map_err(|e| e.holder);
            assert_eq!(got, want.map_err(str::to_string), "{name}");
        }
    }

    #[test]
    fn attachment_intervals_and_writes_are_recorded() {
        let mut l = Ledger::default();
        assert!(l.attach("v", "a", t(0)).is_ok());
        assert_eq!(l.write("v", "a", t(1)), WriteOutcome::Attached);
        assert_eq!(l.write("v", "a", t(2)), WriteOutcome::Attached);
        assert!(l.detach("v", "a", t(3)));
        assert!(!l.detach("v", "a", t(4)), "second detach finds nothing");
        assert!(l.attach("v", "b", t(5)).is_ok());
        assert_eq!(l.write("v", "b", t(6)), WriteOutcome::Attached);
        let h = l.history("v");
        assert_eq!(h.attachments.len(), 2);
        assert_eq!(
            h.attachments[0],
            Attachment {
                host: "a".into(),
                attached_at: t(0),
                detached_at: Some(t(3)),
                first_write: Some(t(1)),
                last_write: Some(t(2)),
                writes: 2,
            }
        );
        assert_eq!(l.attach_times("v", "b"), vec![(t(5), None)]);
        assert_eq!(l.last_write("v", "a"), Some(t(2)));
        assert_eq!(l.writes("v", "b"), 1);
        assert_eq!(l.attached_host("v"), Some("b"));
        assert!(l.violations().is_empty());
    }

    #[test]
    fn violations_table() {
        /// (host, op, second): op is "attach", "detach" or "write".
        type Op = (&'static str, &'static str, i64);
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<Op>, usize, usize)> = vec![
            // name, operations, expected two-writer overlaps, expected stray-write runs
            ("clean hand-over",
             vec![("a","attach",0),("a","write",1),("a","write",2),("a","detach",3),("b","attach",4),("b","write",5)], 0, 0),
            ("write after detach, no other writer",
             vec![("a","attach",0),("a","write",1),("a","detach",2),("a","write",3)], 0, 1),
            ("old host keeps writing after hand-over",
             vec![("a","attach",0),("a","write",1),("a","detach",2),("b","attach",3),("b","write",4),("a","write",5),("b","write",6)], 1, 1),
            ("stray write before the new writer only",
             vec![("a","attach",0),("a","write",1),("a","detach",2),("a","write",3),("b","attach",4),("b","write",5)], 0, 1),
            ("write never attached",
             vec![("a","write",1),("a","write",2)], 0, 1),
            ("stray runs split by a re-attach",
             vec![("a","write",1),("a","attach",2),("a","write",3),("a","detach",4),("a","write",5)], 0, 2),
            ("same host twice is not two writers",
             vec![("a","attach",0),("a","write",1),("a","detach",2),("a","write",3),("a","attach",4),("a","write",5)], 0, 1),
        ];
        for (name, ops, want_overlaps, want_stray) in cases {
            let mut l = Ledger::default();
            for (host, op, s) in ops {
                match op {
                    "attach" => assert!(l.attach("v", host, t(s)).is_ok(), "{name}: attach"),
                    "detach" => assert!(l.detach("v", host, t(s)), "{name}: detach"),
                    _ => {
                        l.write("v", host, t(s));
                    }
                }
            }
            let v = l.violations();
            let overlaps = v
                .iter()
                .filter(|v| matches!(v, Violation::TwoWriters { .. }))
                .count();
            let stray = v
                .iter()
                .filter(|v| matches!(v, Violation::WriteWhileNotAttached { .. }))
                .count();
            assert_eq!(
                (overlaps, stray),
                (want_overlaps, want_stray),
                "{name}: {v:#?}"
            );
        }
    }

    #[test]
    fn shared_storage_refuses_and_reports() {
        let storage = StorageSim::new();
        let other = storage.clone();
        assert!(storage.attach("v", "a").is_ok());
        let refused = other.attach("v", "b");
        assert!(
            refused.as_ref().is_err_and(|e| e.holder == "a"),
            "{refused:?}"
        );
        assert_eq!(other.write("v", "a"), WriteOutcome::Attached);
        assert_eq!(other.write("v", "b"), WriteOutcome::NotAttached);
        assert_eq!(storage.violations().len(), 1);
        assert!(storage.last_write("v", "a").is_some());
    }
}
