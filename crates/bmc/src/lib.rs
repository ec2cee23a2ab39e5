//! hostcycle-bmc
