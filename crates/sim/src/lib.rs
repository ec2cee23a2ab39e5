//! hostcycle-sim
