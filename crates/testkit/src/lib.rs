//! hostcycle-testkit
