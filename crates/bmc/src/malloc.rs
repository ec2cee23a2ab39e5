//! One glibc malloc arena for processes that hold many BMC connections.
//!
//! glibc gives every thread that allocates its own arena (up to 8 per core). With a thousand
//! live TLS connections whose buffers are allocated and freed from several runtime threads,
//! the arenas' free memory adds 6–9 MB to the peak RSS (docs/benchmarks.md: 53–57 MB with the
//! default, 47.8 MB with one arena, same reads/s). The limit can only be set before malloc's
//! first use, and the workspace forbids `unsafe` (no `mallopt`), so the process re-executes
//! itself once with `MALLOC_ARENA_MAX=1`.

use std::ffi::OsString;

/// glibc's environment variable; an administrator's own value is always kept.
pub const MALLOC_ARENA_MAX: &str = "MALLOC_ARENA_MAX";

/// What [`reexec_with_one_arena`] decided, when it returns.
#[derive(Debug)]
pub enum ArenaLimit {
    /// `MALLOC_ARENA_MAX` was already set (by an administrator, or by our own re-exec).
    AlreadySet(OsString),
    /// Not glibc: nothing to do.
    NotGlibc,
    /// The re-exec failed; the process goes on with malloc's defaults.
    ReexecFailed(std::io::Error),
}

/// Re-executes the running program (same PID, arguments, environment and open files) with
/// `MALLOC_ARENA_MAX=1` unless the variable is set. Returns only when it did not re-execute.
/// Call it first thing in `main`, before threads or connections exist.
pub fn reexec_with_one_arena() -> ArenaLimit {
    if let Some(value) = std::env::var_os(MALLOC_ARENA_MAX) {
        return ArenaLimit::AlreadySet(value);
    }
    reexec()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn reexec() -> ArenaLimit {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    // /proc/self/exe: the very file this process runs, even if a build replaced its path.
    let mut command = std::process::Command::new("/proc/self/exe");
    if let Some(argv0) = args.next() {
        command.arg0(argv0);
    }
    command.args(args).env(MALLOC_ARENA_MAX, "1");
    ArenaLimit::ReexecFailed(command.exec())
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn reexec() -> ArenaLimit {
    ArenaLimit::NotGlibc
}
