//! hostcycle-operator
