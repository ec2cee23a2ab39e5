//! Who gets the host controller's next lane slot: a fair scheduler, pure (no I/O, no clock).
//!
//! Every reconcile of a host holds a slot of one lane for its whole run, BMC calls included.
//! Three lanes:
//!
//! - **fencing**: slots kept for hosts carrying a remediation power-off annotation; ordinary
//!   actions and steady polls never take them. A fencing claim takes a fencing slot, or a free
//!   action slot when the fencing lane is full;
//! - **action**: hosts with any other requested power action (reboot, `spec.online`, …);
//! - **steady**: steady-state polls.
//!
//! Within a lane, hosts of one namespace hold at most the namespace's share of it, and hosts
//! of one BMC endpoint at most `per_bmc` slots: so one tenant's hung BMCs (or many hosts aimed
//! at one black-holed address) never hold every slot. Waiting claims are served by class
//! (fencing, then action, then steady), and within a class round-robin across namespaces
//! (the next namespace after the one served last, by name), oldest first within a namespace.
//!
//! [`LaneBook`] keeps the counts and the queues; the operator wraps it in a lock and hands
//! each grant to the waiting reconcile.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// A lane, and the class of a claim (a fencing claim may be served by the action lane).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    Fencing,
    Action,
    Steady,
}

impl Lane {
    /// In the order claims are served.
    pub const ALL: [Lane; 3] = [Lane::Fencing, Lane::Action, Lane::Steady];

    /// The `lane` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Fencing => "fencing",
            Lane::Action => "action",
            Lane::Steady => "steady",
        }
    }

    fn index(self) -> usize {
        match self {
            Lane::Fencing => 0,
            Lane::Action => 1,
            Lane::Steady => 2,
        }
    }

    /// The lanes that may serve a claim of this class, in the order they are tried.
    fn served_by(self) -> &'static [Lane] {
        match self {
            Lane::Fencing => &[Lane::Fencing, Lane::Action],
            Lane::Action => &[Lane::Action],
            Lane::Steady => &[Lane::Steady],
        }
    }
}

/// Sizes and caps of the lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneLimits {
    capacity: [usize; 3],
    per_namespace: [usize; 3],
    per_bmc: usize,
}

impl LaneLimits {
    /// Lanes of these sizes (0 is read as 1); one namespace may hold `namespace_share_percent`
    /// of each lane (rounded up, at least one slot; 0 is read as 1 %, above 100 as 100 %), one
    /// BMC endpoint `per_bmc` slots of each lane (0 is read as 1).
    pub fn new(
        fencing: usize,
        action: usize,
        steady: usize,
        namespace_share_percent: u8,
        per_bmc: usize,
    ) -> LaneLimits {
        let capacity = [fencing.max(1), action.max(1), steady.max(1)];
        let percent = usize::from(namespace_share_percent.clamp(1, 100));
        let per_namespace = capacity.map(|c| (c.saturating_mul(percent).div_ceil(100)).clamp(1, c));
        LaneLimits {
            capacity,
            per_namespace,
            per_bmc: per_bmc.max(1),
        }
    }

    pub fn capacity(&self, lane: Lane) -> usize {
        self.capacity[lane.index()]
    }

    /// Slots of `lane` one namespace may hold at once.
    pub fn per_namespace(&self, lane: Lane) -> usize {
        self.per_namespace[lane.index()]
    }

    /// Slots of each lane one BMC endpoint may hold at once.
    pub fn per_bmc(&self) -> usize {
        self.per_bmc
    }
}

/// What a reconcile asks for: its class, its host's namespace and BMC endpoint (none when the
/// host has no usable BMC address: it is then not counted per BMC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub class: Lane,
    pub namespace: String,
    pub bmc: Option<String>,
}

/// A slot held: give it back with [`LaneBook::release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub lane: Lane,
    pub namespace: String,
    pub bmc: Option<String>,
}

/// Identifies a waiting claim, to withdraw it ([`LaneBook::cancel`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    id: u64,
    class: Lane,
    namespace: String,
}

struct Waiter<W> {
    id: u64,
    bmc: Option<String>,
    item: W,
}

/// Why a claim cannot be served now.
enum Refusal {
    /// Its BMC endpoint holds its share: a later claim of the namespace may still fit.
    Bmc,
    /// The lane is full, or the namespace holds its share: no claim of the namespace fits.
    NamespaceOrLane,
}

/// Slots held and claims waiting. `W` is what a grant hands back (the operator's channel to
/// the waiting reconcile; a label in tests).
pub struct LaneBook<W> {
    limits: LaneLimits,
    held: [usize; 3],
    /// Slots held per namespace and per BMC endpoint, by lane.
    held_by_namespace: HashMap<String, [usize; 3]>,
    held_by_bmc: HashMap<String, [usize; 3]>,
    /// By claim class, then namespace: oldest first.
    waiting: [BTreeMap<String, VecDeque<Waiter<W>>>; 3],
    waiting_count: [usize; 3],
    /// By claim class: the namespace served last (round-robin starts after it).
    last_served: [Option<String>; 3],
    next_id: u64,
}

impl<W> LaneBook<W> {
    pub fn new(limits: LaneLimits) -> LaneBook<W> {
        LaneBook {
            limits,
            held: [0; 3],
            held_by_namespace: HashMap::new(),
            held_by_bmc: HashMap::new(),
            waiting: [BTreeMap::new(), BTreeMap::new(), BTreeMap::new()],
            waiting_count: [0; 3],
            last_served: [None, None, None],
            next_id: 0,
        }
    }

    pub fn limits(&self) -> &LaneLimits {
        &self.limits
    }

    /// Slots of `lane` held now.
    pub fn held(&self, lane: Lane) -> usize {
        self.held[lane.index()]
    }

    /// Claims of class `class` waiting now.
    pub fn waiting(&self, class: Lane) -> usize {
        self.waiting_count[class.index()]
    }

    /// Queues a claim; [`LaneBook::next_grant`] serves it when its turn comes.
    pub fn enqueue(&mut self, claim: Claim, item: W) -> Ticket {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.waiting[claim.class.index()]
            .entry(claim.namespace.clone())
            .or_default()
            .push_back(Waiter {
                id,
                bmc: claim.bmc,
                item,
            });
        self.waiting_count[claim.class.index()] += 1;
        Ticket {
            id,
            class: claim.class,
            namespace: claim.namespace,
        }
    }

    /// Withdraws a waiting claim; `None` when it is no longer waiting (it was granted).
    pub fn cancel(&mut self, ticket: &Ticket) -> Option<W> {
        let class = ticket.class.index();
        let queue = self.waiting[class].get_mut(&ticket.namespace)?;
        let at = queue.iter().position(|w| w.id == ticket.id)?;
        let waiter = queue.remove(at)?;
        if queue.is_empty() {
            self.waiting[class].remove(&ticket.namespace);
        }
        self.waiting_count[class] -= 1;
        Some(waiter.item)
    }

    /// The next claim to serve, if any can be: taken off its queue and counted as holding the
    /// returned slot. Call it until it returns `None` after every change (a claim queued, a
    /// slot released).
    pub fn next_grant(&mut self) -> Option<(W, Slot)> {
        for class in Lane::ALL {
            if self.waiting_count[class.index()] == 0
                || class
                    .served_by()
                    .iter()
                    .all(|lane| self.held(*lane) >= self.limits.capacity(*lane))
            {
                continue;
            }
            if let Some((namespace, at, lane)) = self.first_servable(class) {
                return self.grant(class, namespace, at, lane);
            }
        }
        None
    }

    /// Gives a slot back.
    pub fn release(&mut self, slot: &Slot) {
        let lane = slot.lane.index();
        self.held[lane] = self.held[lane].saturating_sub(1);
        decrement(&mut self.held_by_namespace, &slot.namespace, slot.lane);
        if let Some(bmc) = &slot.bmc {
            decrement(&mut self.held_by_bmc, bmc, slot.lane);
        }
    }

    /// Round-robin over the namespaces with a waiting claim of `class`, from the one after the
    /// namespace served last: the first namespace with a claim that fits, the claim's place in
    /// its queue and the lane that serves it.
    fn first_servable(&self, class: Lane) -> Option<(String, usize, Lane)> {
        let queues = &self.waiting[class.index()];
        let served_before =
            |namespace: &str| self.last_served[class.index()].as_deref() >= Some(namespace);
        let later = queues.iter().filter(|(ns, _)| !served_before(ns));
        let earlier = queues.iter().filter(|(ns, _)| served_before(ns));
        for (namespace, queue) in later.chain(earlier) {
            for (at, waiter) in queue.iter().enumerate() {
                match self.lane_for(class, namespace, waiter.bmc.as_deref()) {
                    Ok(lane) => return Some((namespace.clone(), at, lane)),
                    Err(Refusal::Bmc) => continue,
                    Err(Refusal::NamespaceOrLane) => break,
                }
            }
        }
        None
    }

    /// The lane that would serve a claim of `class` from `namespace` and `bmc` now.
    fn lane_for(&self, class: Lane, namespace: &str, bmc: Option<&str>) -> Result<Lane, Refusal> {
        let mut refusal = Refusal::NamespaceOrLane;
        for &lane in class.served_by() {
            let lane_full = self.held(lane) >= self.limits.capacity(lane);
            let namespace_full =
                count(&self.held_by_namespace, namespace, lane) >= self.limits.per_namespace(lane);
            if lane_full || namespace_full {
                continue;
            }
            if bmc.is_some_and(|b| count(&self.held_by_bmc, b, lane) >= self.limits.per_bmc) {
                refusal = Refusal::Bmc;
                continue;
            }
            return Ok(lane);
        }
        Err(refusal)
    }

    fn grant(
        &mut self,
        class: Lane,
        namespace: String,
        at: usize,
        lane: Lane,
    ) -> Option<(W, Slot)> {
        let queues = &mut self.waiting[class.index()];
        let queue = queues.get_mut(&namespace)?;
        let waiter = queue.remove(at)?;
        if queue.is_empty() {
            queues.remove(&namespace);
        }
        self.waiting_count[class.index()] -= 1;
        self.held[lane.index()] += 1;
        self.held_by_namespace.entry(namespace.clone()).or_default()[lane.index()] += 1;
        if let Some(bmc) = &waiter.bmc {
            self.held_by_bmc.entry(bmc.clone()).or_default()[lane.index()] += 1;
        }
        self.last_served[class.index()] = Some(namespace.clone());
        Some((
            waiter.item,
            Slot {
                lane,
                namespace,
                bmc: waiter.bmc,
            },
        ))
    }
}

fn count(map: &HashMap<String, [usize; 3]>, key: &str, lane: Lane) -> usize {
    map.get(key).map_or(0, |held| held[lane.index()])
}

fn decrement(map: &mut HashMap<String, [usize; 3]>, key: &str, lane: Lane) {
    if let Some(held) = map.get_mut(key) {
        held[lane.index()] = held[lane.index()].saturating_sub(1);
        if held.iter().all(|n| *n == 0) {
            map.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// One step of a case, then every grant it allows (in order).
    enum Step {
        /// A claim: its label, class, namespace and BMC endpoint.
        Claim(&'static str, Lane, &'static str, Option<&'static str>),
        /// The slot granted to this label is given back.
        Release(&'static str),
        /// The claim with this label is withdrawn while it waits.
        Cancel(&'static str),
    }
    use Lane::{Action as A, Fencing as F, Steady as S};
    use Step::{Cancel, Claim as C, Release as R};

    /// Runs `steps`; returns, per step, the labels granted after it with their lane.
    fn run(limits: LaneLimits, steps: &[Step]) -> Vec<Vec<(&'static str, Lane)>> {
        let mut book: LaneBook<&'static str> = LaneBook::new(limits);
        let mut tickets = HashMap::new();
        let mut slots = HashMap::new();
        let mut out = Vec::new();
        for step in steps {
            match step {
                Step::Claim(label, class, namespace, bmc) => {
                    let ticket = book.enqueue(
                        Claim {
                            class: *class,
                            namespace: namespace.to_string(),
                            bmc: bmc.map(str::to_string),
                        },
                        *label,
                    );
                    tickets.insert(*label, ticket);
                }
                Step::Release(label) => {
                    let slot = slots.remove(label).expect("released a slot never granted");
                    book.release(&slot);
                }
                Step::Cancel(label) => {
                    assert_eq!(book.cancel(&tickets[label]), Some(*label), "cancel {label}");
                }
            }
            let mut granted = Vec::new();
            while let Some((label, slot)) = book.next_grant() {
                granted.push((label, slot.lane));
                slots.insert(label, slot);
            }
            out.push(granted);
        }
        out
    }

    #[test]
    fn shares_are_rounded_up_and_never_zero() {
        #[rustfmt::skip]
        let cases = [
            // (fencing, action, steady, share %, per BMC) → per namespace (fencing, action, steady)
            ((16, 64, 64, 50, 8),  (8, 32, 32)),
            ((1, 1, 1, 50, 8),     (1, 1, 1)),
            ((3, 3, 3, 50, 8),     (2, 2, 2)),
            ((4, 64, 10, 100, 8),  (4, 64, 10)),
            ((4, 64, 10, 0, 0),    (1, 1, 1)),
            ((0, 0, 0, 255, 0),    (1, 1, 1)),
            ((16, 64, 5000, 1, 8), (1, 1, 50)),
        ];
        for ((fencing, action, steady, share, bmc), expected) in cases {
            let limits = LaneLimits::new(fencing, action, steady, share, bmc);
            let got = (
                limits.per_namespace(F),
                limits.per_namespace(A),
                limits.per_namespace(S),
            );
            assert_eq!(got, expected, "{fencing} {action} {steady} {share}%");
            assert!(limits.per_bmc() >= 1);
        }
    }

    /// One case: its name, the limits, the steps, and who holds a slot after each step.
    type SchedulerCase = (
        &'static str,
        LaneLimits,
        Vec<Step>,
        Vec<Vec<(&'static str, Lane)>>,
    );

    #[test]
    fn who_gets_the_next_slot() {
        #[rustfmt::skip]
        let cases: Vec<SchedulerCase> = vec![
            (
                "one namespace holds at most its share; another namespace is served at once",
                LaneLimits::new(1, 4, 4, 50, 8),
                vec![C("t1", S, "tenant", None), C("t2", S, "tenant", None),
                     C("t3", S, "tenant", None), C("o1", S, "other", None)],
                vec![vec![("t1", S)], vec![("t2", S)], vec![], vec![("o1", S)]],
            ),
            (
                "round-robin across namespaces, oldest first within one",
                LaneLimits::new(1, 1, 1, 100, 8),
                vec![C("a1", S, "a", None), C("a2", S, "a", None), C("a3", S, "a", None),
                     C("b1", S, "b", None), C("c1", S, "c", None),
                     R("a1"), R("b1"), R("c1"), R("a2")],
                vec![vec![("a1", S)], vec![], vec![], vec![], vec![],
                     vec![("b1", S)], vec![("c1", S)], vec![("a2", S)], vec![("a3", S)]],
            ),
            (
                "round-robin wraps past the last namespace by name",
                LaneLimits::new(1, 1, 1, 100, 8),
                vec![C("c1", A, "c", None), C("a1", A, "a", None), C("c2", A, "c", None),
                     C("b1", A, "b", None), R("c1"), R("a1"), R("b1")],
                vec![vec![("c1", A)], vec![], vec![], vec![],
                     vec![("a1", A)], vec![("b1", A)], vec![("c2", A)]],
            ),
            (
                "one BMC endpoint holds at most its slots; a claim of another BMC passes it",
                LaneLimits::new(1, 8, 8, 100, 1),
                vec![C("x1", S, "a", Some("x")), C("x2", S, "a", Some("x")),
                     C("y1", S, "a", Some("y")), C("n1", S, "a", None), R("x1")],
                vec![vec![("x1", S)], vec![], vec![("y1", S)], vec![("n1", S)], vec![("x2", S)]],
            ),
            (
                "a BMC's cap holds across namespaces",
                LaneLimits::new(1, 8, 8, 100, 2),
                vec![C("a1", A, "a", Some("x")), C("b1", A, "b", Some("x")),
                     C("c1", A, "c", Some("x")), C("c2", A, "c", Some("y"))],
                vec![vec![("a1", A)], vec![("b1", A)], vec![], vec![("c2", A)]],
            ),
            (
                "steady polls and actions never wait for each other",
                LaneLimits::new(1, 1, 1, 100, 8),
                vec![C("s1", S, "a", None), C("s2", S, "a", None), C("r1", A, "a", None)],
                vec![vec![("s1", S)], vec![], vec![("r1", A)]],
            ),
            (
                "ordinary actions never take the fencing lane",
                LaneLimits::new(2, 1, 1, 100, 8),
                vec![C("r1", A, "a", None), C("r2", A, "b", None), C("r3", A, "c", None)],
                vec![vec![("r1", A)], vec![], vec![]],
            ),
            (
                "fencing takes its lane while the action lane is full, then free action slots",
                LaneLimits::new(1, 2, 1, 100, 8),
                vec![C("r1", A, "a", None), C("r2", A, "b", None), C("r3", A, "c", None),
                     C("f1", F, "d", None), C("f2", F, "e", None), R("r1"), R("r2")],
                vec![vec![("r1", A)], vec![("r2", A)], vec![], vec![("f1", F)], vec![],
                     // a freed action slot goes to the waiting power-off first
                     vec![("f2", A)], vec![("r3", A)]],
            ),
            (
                "one namespace holds at most its share of the fencing lane",
                LaneLimits::new(4, 1, 1, 50, 8),
                vec![C("t1", F, "tenant", None), C("t2", F, "tenant", None),
                     C("t3", F, "tenant", None), C("t4", F, "tenant", None),
                     C("o1", F, "other", None)],
                vec![vec![("t1", F)], vec![("t2", F)], vec![("t3", A)], vec![], vec![("o1", F)]],
            ),
            (
                "64 hung hosts of one namespace leave half of every lane to the others",
                LaneLimits::new(16, 64, 64, 50, 8),
                (0..64).map(|_| C("t", A, "tenant", None))
                    .chain((0..64).map(|_| C("t", S, "tenant", None)))
                    .chain([C("reboot", A, "other", None), C("poll", S, "other", None),
                            C("fence", F, "third", None)])
                    .collect(),
                std::iter::repeat_n(vec![("t", A)], 32)
                    .chain(std::iter::repeat_n(vec![], 32))
                    .chain(std::iter::repeat_n(vec![("t", S)], 32))
                    .chain(std::iter::repeat_n(vec![], 32))
                    .chain([vec![("reboot", A)], vec![("poll", S)], vec![("fence", F)]])
                    .collect(),
            ),
            (
                "a withdrawn claim is never granted",
                LaneLimits::new(1, 1, 1, 100, 8),
                vec![C("a1", S, "a", None), C("a2", S, "a", None), C("b1", S, "b", None),
                     Cancel("b1"), R("a1")],
                vec![vec![("a1", S)], vec![], vec![], vec![], vec![("a2", S)]],
            ),
        ];
        for (name, limits, steps, expected) in cases {
            assert_eq!(run(limits, &steps), expected, "{name}");
        }
    }

    #[test]
    fn counts_follow_grants_releases_and_withdrawals() {
        let mut book: LaneBook<u32> = LaneBook::new(LaneLimits::new(1, 1, 1, 100, 8));
        let claim = |class| Claim {
            class,
            namespace: "a".into(),
            bmc: Some("x".into()),
        };
        book.enqueue(claim(S), 1);
        let waiting = book.enqueue(claim(S), 2);
        assert_eq!((book.held(S), book.waiting(S)), (0, 2));
        let (first, slot) = book.next_grant().unwrap();
        assert_eq!(first, 1);
        assert!(book.next_grant().is_none());
        assert_eq!((book.held(S), book.waiting(S)), (1, 1));
        assert_eq!(book.cancel(&waiting), Some(2));
        assert_eq!(book.cancel(&waiting), None, "withdrawn twice");
        book.release(&slot);
        assert_eq!((book.held(S), book.waiting(S)), (0, 0));
        assert!(book.held_by_namespace.is_empty() && book.held_by_bmc.is_empty());
    }
}
