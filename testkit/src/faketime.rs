//! A child process with its wall clock moved, through libfaketime (Debian's `faketime` package,
//! which `scripts/install-deps` installs): for the tests where the relay's or the CLI's clock
//! disagrees with the database's. Only the child is affected; PostgreSQL keeps the real time.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Environment variable naming libfaketime's preload library, where it is not in a usual place.
pub const FAKETIME_LIB_ENV: &str = "OUTBOX_TEST_FAKETIME_LIB";

/// libfaketime's preload library. Panics, saying what to install, when it is not there: a test of
/// a moved clock must not pass without moving it.
pub fn libfaketime() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(p) = std::env::var_os(FAKETIME_LIB_ENV) {
            return PathBuf::from(p);
        }
        let mut dirs = vec![
            PathBuf::from("/usr/lib/faketime"),
            PathBuf::from("/usr/local/lib/faketime"),
        ];
        // Debian's multiarch directories: /usr/lib/x86_64-linux-gnu/faketime, ...
        if let Ok(entries) = std::fs::read_dir("/usr/lib") {
            dirs.extend(entries.flatten().map(|e| e.path().join("faketime")));
        }
        dirs.into_iter()
            .map(|d| d.join("libfaketime.so.1"))
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "libfaketime.so.1 not found: install Debian's `faketime` package \
                     (`scripts/install-deps` installs every tool the tests need) or set \
                     ${FAKETIME_LIB_ENV}"
                )
            })
    })
}

/// Makes the process `cmd` starts see its wall clock (`SystemTime`, `clock_gettime(CLOCK_REALTIME)`)
/// moved by `offset`, in libfaketime's relative syntax: `"+1h"`, `"-10m"`, `"+90s"`. Its monotonic
/// clock (timers, `Instant`) is left alone, as a machine whose wall clock is off has it.
pub fn move_clock(cmd: &mut Command, offset: &str) {
    assert!(
        offset.starts_with('+') || offset.starts_with('-'),
        "a relative offset such as +1h or -10m, not {offset:?}"
    );
    cmd.env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
}
