//! hostcycle-api
