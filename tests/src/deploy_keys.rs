//! Keys for the tests of hot deploy: a deploy key and a host key made as
//! `idem keygen` makes them, the `[deploy]` table that trusts them, the
//! environment `idem deploy` reads the deploy key from, and deployment
//! records signed by hand (as only a key holder can write them).

use idem::deploy::Deployment;
use idem::deploy::keys::{Role, generate, read_seed};
use idem::deploy::store::DeployStore;
use nkeys::KeyPair;
use std::path::{Path, PathBuf};

/// A deploy key and a host key, their seeds in files of a test directory.
pub struct DeployKeys {
    /// The deploy key's seed file (mode 0600).
    pub seed: PathBuf,
    /// The deploy key's public key (`M…`).
    pub public: String,
    /// The host key's seed file (mode 0600).
    pub host_seed: PathBuf,
    /// The host key's public key (`N…`).
    pub host_public: String,
}

impl DeployKeys {
    /// The keys `name` in `dir` (`NAME.deploy.nk`, `NAME.host.nk`), made
    /// by `idem keygen`'s code the first time, read back after.
    pub fn named(dir: &Path, name: &str) -> Self {
        let key = |role: Role, file: String| {
            let path = dir.join(file);
            let public = if path.exists() {
                read_seed(&path, role).unwrap().public_key()
            } else {
                generate(&path, role).unwrap()
            };
            (path, public)
        };
        let (seed, public) = key(Role::Deploy, format!("{name}.deploy.nk"));
        let (host_seed, host_public) = key(Role::Host, format!("{name}.host.nk"));
        DeployKeys {
            seed,
            public,
            host_seed,
            host_public,
        }
    }

    /// The test's keys in `dir` ([`DeployKeys::named`] `keys`): what every
    /// config of a test in `dir` trusts.
    pub fn of(dir: &Path) -> Self {
        Self::named(dir, "keys")
    }

    /// The `[deploy]` table that trusts `deploy_keys` and this host key,
    /// and signs the host's reports with it.
    pub fn section_trusting(&self, deploy_keys: &[&str]) -> String {
        format!(
            "[deploy]\ntrusted_keys = {deploy_keys:?}\nhost_key = \"{}\"\ntrusted_hosts = [\"{}\"]\n",
            self.host_seed.display(),
            self.host_public
        )
    }

    /// The `[deploy]` table that trusts these keys.
    pub fn section(&self) -> String {
        self.section_trusting(&[&self.public])
    }

    /// The environment that gives `idem deploy` this deploy key.
    pub fn env(&self) -> [(&'static str, &str); 1] {
        [("IDEM_SIGNING_KEY", self.seed.to_str().unwrap())]
    }

    /// The deploy key itself.
    pub fn pair(&self) -> KeyPair {
        read_seed(&self.seed, Role::Deploy).unwrap()
    }

    /// `d` signed for `handler`, replacing its key's last revision now;
    /// without a sequence of its own, it gets the clock's Unix
    /// milliseconds as `idem deploy` gives it (above every earlier one).
    pub async fn signed(
        &self,
        store: &DeployStore,
        handler: &str,
        mut d: Deployment,
    ) -> Deployment {
        d.replaces = store.last_revision(handler).await.unwrap();
        if d.sequence == 0 {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            d.sequence = u64::try_from(now.unwrap().as_millis()).unwrap();
        }
        idem::deploy::trust::sign(&self.pair(), handler, &mut d).unwrap();
        d
    }

    /// Puts `d`, signed for `handler`, as its record (a plain put, as a
    /// key holder writing by hand would); returns its revision.
    pub async fn put_signed(&self, store: &DeployStore, handler: &str, d: Deployment) -> u64 {
        let d = self.signed(store, handler, d).await;
        store
            .deployments()
            .put(handler, d.to_value().into())
            .await
            .unwrap()
    }
}

/// Appends `keys`' `[deploy]` table to the config file `cfg`.
pub fn trust_in(cfg: &Path, keys: &DeployKeys) {
    let mut text = std::fs::read_to_string(cfg).unwrap();
    text.push_str(&keys.section());
    std::fs::write(cfg, text).unwrap();
}

/// `idem deploy --config cfg ARGS`, signing with the test's deploy key
/// ([`DeployKeys::of`] the config's directory): `(exit code, stdout,
/// stderr)`.
pub fn deploy_cli(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["deploy", "--config", cfg.to_str().unwrap()];
    all.extend_from_slice(args);
    crate::idem_cli(&all, &DeployKeys::of(cfg.parent().unwrap()).env())
}

/// The deploy buckets of the broker at `url` (`[deploy]` defaults), over a
/// connection of idem's own as the host makes it.
///
/// # Errors
/// As [`DeployStore::open`]: the broker cannot be reached, or a bucket
/// cannot be opened or created.
pub async fn deploy_store(url: &str) -> anyhow::Result<DeployStore> {
    let broker = idem::broker::connect(&idem::config::BrokerConfig {
        url: url.to_owned(),
        ..Default::default()
    })
    .await?;
    DeployStore::open(&broker, &idem::config::DeployConfig::default()).await
}
