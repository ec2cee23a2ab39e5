//! What the controllers read of the cluster: the watches they share and the objects' shared
//! reductions.

pub mod objects;
pub mod watch;
