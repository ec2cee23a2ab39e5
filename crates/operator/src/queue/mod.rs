//! The reboot queue controller.

pub mod observe;
