//! hostcycle-core: pure decision logic. No I/O: the controllers observe, call into this
//! crate with a snapshot, and carry out the returned actions.

pub mod binding;
pub mod bmh;
pub mod conditions;
pub mod evidence;
pub mod health;
pub mod node;
pub mod queue;
pub mod remediation;
pub mod text;
pub mod time;
