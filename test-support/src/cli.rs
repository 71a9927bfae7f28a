//! Running a CLI binary that cargo builds beside the test binaries.

use std::path::{Path, PathBuf};

/// The binary `name` of this workspace (e.g. `idem-test-host`), which cargo
/// builds into the profile directory beside the running test's: the test
/// runs as `<target>/<profile>/deps/<test>`, the binary is
/// `<target>/<profile>/<name>`.
///
/// # Panics
/// When the binary is missing (cargo builds a package's binaries with its
/// integration tests, not with another package's).
pub fn binary_beside_tests(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: cargo builds it with the tests",
        bin.display()
    );
    bin
}

/// Runs `bin` with `args` and `env` to its end: `(exit code, stdout,
/// stderr)`, the code -1 when a signal ended it. The variables in `env`
/// are the only `IDEM_*` config (and `CREDENTIALS_DIRECTORY`) it sees: any
/// the test runner has are removed first. Logging is off (`RUST_LOG=off`)
/// unless `env` sets `RUST_LOG`, so stderr holds only what the CLI prints
/// itself (its one-line errors).
///
/// # Panics
/// When `bin` cannot be started.
pub fn run_cli(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("IDEM_") || k == "CREDENTIALS_DIRECTORY" {
            cmd.env_remove(k);
        }
    }
    if !env.iter().any(|(k, _)| *k == "RUST_LOG") {
        cmd.env("RUST_LOG", "off");
    }
    let out = cmd
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
