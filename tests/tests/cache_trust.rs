//! The compiled-component cache loads only what idem's user wrote, against
//! real nats-server and SQLite, with a second local user (uid 65534, through
//! `setpriv`; the tests run as root) as the attacker:
//!
//! - with the cache's `modules/` writable by others, that user swaps in a
//!   directory holding component C's compiled code under component B's
//!   key: the host compiles B without the cache (one warning), and the
//!   message has B's effect, its receipt B's digest;
//! - a compiled file that user planted in a directory it could write then
//!   (made private again since) is removed and B compiled again, after
//!   which the cache hits as before;
//! - a cache under a parent another user owns, or may write, is refused at
//!   start; under root's sticky `/tmp` it is used.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::runtime::{LoadOptions, Runtime};
use idem_tests::examples::sha256_hex;
use idem_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The unprivileged user the attacker runs as.
const OTHER: u32 = 65534;

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `script` with `sh -c` as uid/gid [`OTHER`], no supplementary groups.
fn as_other_user(script: &str) {
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid",
            &OTHER.to_string(),
            "--regid",
            &OTHER.to_string(),
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `idem.toml` in `dir`: handler `h` running `guest` (a credit handler on
/// `accounts`), `[runtime]` with `runtime` as its body, and deployments
/// not followed (so the only warnings are the cache's).
fn config(dir: &Path, nats: &Nats, db: &TestDb, guest: &str, runtime: &str) -> PathBuf {
    let cfg = write_config(dir, nats, db, &[HandlerSpec::new("h", guest)]);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!("[runtime]\n{runtime}\n[deploy]\nfollow = false\n"));
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// `idem run --drain` with JSON logs: the exit code, the one "component
/// loaded" line's `cache` field, and the WARN lines' messages.
fn drain(cfg: &Path) -> (i32, String, Vec<String>) {
    let out = std::process::Command::new(test_host())
        .args(["--log-format", "json", "run", "--drain", "--config"])
        .arg(cfg)
        .env("RUST_LOG", "idem=info")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let cache = lines
        .iter()
        .filter(|v| v["message"] == "component loaded")
        .map(|v| v["cache"].as_str().unwrap_or_default().to_owned())
        .collect::<Vec<_>>();
    let warnings = lines
        .iter()
        .filter(|v| v["level"] == "WARN")
        .map(|v| v["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(cache.len() <= 1, "{log}");
    (
        out.status.code().unwrap_or(-1),
        cache.into_iter().next().unwrap_or_default(),
        warnings,
    )
}

/// The compiled files idem keeps for this engine: the `modules/<engine>/`
/// directory and the file names in it (no temporary files).
fn compiled_files(cache: &Path) -> (PathBuf, Vec<String>) {
    let versions: Vec<PathBuf> = std::fs::read_dir(cache.join("modules"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(versions.len(), 1, "{versions:?}");
    let mut files: Vec<String> = std::fs::read_dir(&versions[0])
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.contains('.'))
        .collect();
    files.sort();
    (versions[0].clone(), files)
}

/// Compiles `guest` into `cache` as a host would, and returns the name of
/// the file it added.
fn compile_into(cache: &Path, guest_name: &str) -> String {
    let before = std::fs::metadata(cache.join("modules"))
        .ok()
        .map(|_| compiled_files(cache).1)
        .unwrap_or_default();
    let rt = Runtime::with_cache(1, Some(cache)).unwrap();
    rt.load(&guest(guest_name), LoadOptions::default()).unwrap();
    let (_, after) = compiled_files(cache);
    let added: Vec<String> = after.into_iter().filter(|f| !before.contains(f)).collect();
    assert_eq!(added.len(), 1, "{added:?}");
    added[0].clone()
}

/// Attack 6 of the review: `modules/` writable by others; another user puts
/// C's (`behave`) compiled code under B's (`credit`) key. Without the
/// check the host would run C, which rejects the credit payload (a dead
/// letter, no balance); with it, B credits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_code_another_user_put_under_a_key_is_never_run() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    chmod(&cache, 0o755);
    let runtime = format!("cache_dir = \"{}\"", cache.display());
    let cfg = config(dir.path(), &nats, &db, "credit", &runtime);

    let c_file = compile_into(&cache, "behave");
    let b_file = compile_into(&cache, "credit");
    let (version_dir, _) = compiled_files(&cache);
    let version = version_dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    // The host finds B under the key this test computed it at.
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let js = nats.jetstream().await;
    publish(&js, "accounts.credit", &credit("e1", 1, 5), &[]).await;
    let (code, outcome, warnings) = drain(&cfg);
    assert_eq!((code, outcome.as_str()), (0, "hit"), "{warnings:?}");
    assert_eq!(db.balance(1).await, Some(5));

    // The attack: modules/ writable by others; the other user moves the
    // version directory aside and makes its own, with C's code as B.
    let modules = cache.join("modules");
    chmod(&modules, 0o777);
    // idem keeps its files private (0700, 0600); the attacker brings
    // compiled code of its own, as it could by compiling C with this idem.
    chmod(&version_dir, 0o755);
    chmod(&version_dir.join(&c_file), 0o644);
    as_other_user(&format!(
        "cd {m} && mv {version} aside && mkdir {version} && cp -- aside/{c_file} {version}/{b_file}",
        m = modules.display()
    ));
    publish(&js, "accounts.credit", &credit("e2", 1, 7), &[]).await;
    let (code, outcome, warnings) = drain(&cfg);
    assert_eq!((code, outcome.as_str()), (0, "skipped"), "{warnings:?}");
    assert_eq!(
        warnings,
        vec![format!(
            "compiling without the compiled-component cache: {} is writable by other users (mode 777); whoever could write there may have renamed code under another component's name: delete the cache directory (idem makes it again, private), or set [runtime] cache = false",
            std::fs::canonicalize(&modules).unwrap().display()
        )]
    );
    // B ran: the credit applied, under B's digest; nothing dead-lettered.
    assert_eq!(db.balance(1).await, Some(12));
    assert_eq!(db.dead_letters("h").await, vec![]);
    let b_digest = sha256_hex(&std::fs::read(guest("credit")).unwrap());
    assert_eq!(
        db.receipt_digests("h").await,
        vec![
            ("e1".to_owned(), b_digest.clone()),
            ("e2".to_owned(), b_digest)
        ]
    );
}

/// A file the other user planted while the version directory was writable
/// (since made private again) is removed before the compile: B is compiled
/// again, not C run, and the cache hits on the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_compiled_file_is_removed_and_compiled_again() {
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    chmod(&cache, 0o755);
    let runtime = format!("cache_dir = \"{}\"", cache.display());
    let cfg = config(dir.path(), &nats, &db, "credit", &runtime);
    let c_file = compile_into(&cache, "behave");
    let b_file = compile_into(&cache, "credit");
    let (version_dir, _) = compiled_files(&cache);

    chmod(&cache.join("modules"), 0o755);
    chmod(&version_dir, 0o777);
    chmod(&version_dir.join(&c_file), 0o644);
    as_other_user(&format!(
        "cd {v} && cp -- {c_file} planted && mv -f -- planted {b_file}",
        v = version_dir.display()
    ));
    chmod(&version_dir, 0o755);
    create_stream(&nats, "ACCOUNTS", &["accounts.credit"]).await;
    let js = nats.jetstream().await;
    publish(&js, "accounts.credit", &credit("e1", 1, 5), &[]).await;
    let (code, outcome, warnings) = drain(&cfg);
    assert_eq!((code, outcome.as_str()), (0, "miss"), "{warnings:?}");
    let planted = std::fs::canonicalize(&version_dir).unwrap().join(&b_file);
    assert_eq!(
        warnings,
        vec![format!(
            "removed 1 file(s) idem's user did not write from the compiled-component cache before compiling, so they are compiled again, not run: {} belongs to another user (uid {OTHER}); find out who can write into {}",
            planted.display(),
            cache.display()
        )]
    );
    assert_eq!(db.balance(1).await, Some(5));
    assert_eq!(db.dead_letters("h").await, vec![]);
    // What the host wrote in its place is idem's own: the next start hits.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&planted).unwrap().uid(), 0);
    publish(&js, "accounts.credit", &credit("e2", 1, 7), &[]).await;
    let (code, outcome, warnings) = drain(&cfg);
    assert_eq!((code, outcome.as_str(), warnings), (0, "hit", vec![]));
    assert_eq!(db.balance(1).await, Some(12));
}

/// A cache whose parent another user owns, or may write, is refused at
/// start with one line; root's sticky `/tmp` is a parent like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_under_a_parent_another_user_controls_is_refused() {
    use std::os::unix::fs::chown;
    let nats = Nats::start();
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let refused = |cfg: &Path| {
        let (code, _, err) = idem_cli(&["run", "--drain", "--config", cfg.to_str().unwrap()], &[]);
        assert_eq!(code, 1, "{err}");
        err
    };

    // The parent belongs to the other user: it could rename the cache away
    // and put its own in its place.
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chown(&theirs, Some(OTHER), Some(OTHER)).unwrap();
    let cache = theirs.join("cache");
    std::fs::create_dir(&cache).unwrap();
    chmod(&cache, 0o700);
    let cfg = config(
        dir.path(),
        &nats,
        &db,
        "credit",
        &format!("cache_dir = \"{}\"", cache.display()),
    );
    assert_eq!(
        refused(&cfg),
        format!(
            "idem: cannot start the wasm runtime: the compiled-component cache {} is inside {}, which belongs to another user (uid {OTHER}); whoever controls it can replace the code idem loads: set [runtime] cache_dir to a directory whose parents only root or idem's user can write, or cache = false\n",
            cache.display(),
            theirs.display()
        )
    );

    // Root's, but anyone may write it (no sticky bit).
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let cache = open.join("a/cache");
    let cfg = config(
        dir.path(),
        &nats,
        &db,
        "credit",
        &format!("cache_dir = \"{}\"", cache.display()),
    );
    assert_eq!(
        refused(&cfg),
        format!(
            "idem: cannot start the wasm runtime: the compiled-component cache {} is inside {}, which is writable by other users (mode 777); whoever controls it can replace the code idem loads: set [runtime] cache_dir to a directory whose parents only root or idem's user can write, or cache = false\n",
            cache.display(),
            open.display()
        )
    );
    assert!(!open.join("a").exists(), "nothing is made in it");

    // Reached through a symlink in a directory the other user may write:
    // the link's directory is a parent too.
    let link = open.join("link");
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::os::unix::fs::symlink(&private, &link).unwrap();
    let cache = link.join("cache");
    let cfg = config(
        dir.path(),
        &nats,
        &db,
        "credit",
        &format!("cache_dir = \"{}\"", cache.display()),
    );
    assert!(refused(&cfg).contains(&format!("is inside {}, which is writable", open.display())),);

    // Root's sticky /tmp (the temporary directory's parent): used.
    assert!(dir.path().starts_with("/tmp"), "{}", dir.path().display());
    let cache = dir.path().join("fine");
    let cfg = config(
        dir.path(),
        &nats,
        &db,
        "credit",
        &format!("cache_dir = \"{}\"", cache.display()),
    );
    let (code, outcome, warnings) = drain(&cfg);
    assert_eq!((code, outcome.as_str(), warnings), (0, "miss", vec![]));
}
