//! hostcycle-core
