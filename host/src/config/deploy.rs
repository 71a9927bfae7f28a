//! `[deploy]`: the buckets of hot deploy, and the keys whose signatures a
//! host believes (docs/deploying.md).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `[deploy]`: where `idem deploy` puts new handler versions and the hosts
/// find them (JetStream buckets on the broker of `[broker]`), and whose
/// signatures the hosts believe (docs/deploying.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeployConfig {
    /// Whether a running host follows the deployments bucket: runs each
    /// handler's deployed version, and swaps in a new one when it is
    /// deployed. Default true. Off, or without `trusted_keys`, the host
    /// runs the config's `module`.
    #[serde(default = "default_follow")]
    pub follow: bool,
    /// The public keys (`M…`, `idem keygen` prints one) whose signed
    /// deployments hosts run; a record signed by no key listed here is
    /// refused. Two during a key rotation. Default none: deployments are
    /// not followed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_keys: Vec<String>,
    /// A file holding this host's NKey seed (`SN…`, `idem keygen --host`
    /// makes one), with which it signs its reports to the hosts bucket. A
    /// relative path is read from `$CREDENTIALS_DIRECTORY` when set, else
    /// the config file's directory; refused when other users may read it.
    /// Default none: reports are unsigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_key: Option<PathBuf>,
    /// The public keys (`N…`) of the hosts whose reports `idem status`
    /// shows as verified and `idem deploy --wait` counts; any other report
    /// is shown as unverified (and ignored by `--wait` when this is set).
    /// Default none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_hosts: Vec<String>,
    /// JetStream Object Store bucket of the deployed components, each named
    /// by its SHA-256 (hex). Default `idem-modules`.
    #[serde(default = "default_modules_bucket")]
    pub modules_bucket: String,
    /// JetStream KV bucket of the deployments: key = handler name, value =
    /// the deployment ([`crate::deploy::Deployment`]), history kept.
    /// Default `idem-deployments`.
    #[serde(default = "default_deployments_bucket")]
    pub deployments_bucket: String,
    /// JetStream KV bucket where each running host reports what it runs
    /// (`idem status`, `idem deploy --wait`); entries expire when a host
    /// stops reporting. Default `idem-hosts`.
    #[serde(default = "default_hosts_bucket")]
    pub hosts_bucket: String,
    /// JetStream KV bucket of the shadow deployments (`idem deploy
    /// --shadow`): key = handler name, value = the candidate
    /// ([`crate::shadow::record::ShadowRecord`]). Default `idem-shadows`.
    #[serde(default = "default_shadows_bucket")]
    pub shadows_bucket: String,
}

impl Default for DeployConfig {
    fn default() -> Self {
        Self {
            follow: default_follow(),
            trusted_keys: Vec::new(),
            host_key: None,
            trusted_hosts: Vec::new(),
            modules_bucket: default_modules_bucket(),
            deployments_bucket: default_deployments_bucket(),
            hosts_bucket: default_hosts_bucket(),
            shadows_bucket: default_shadows_bucket(),
        }
    }
}

impl DeployConfig {
    /// Resolves `host_key` against `secrets` (`$CREDENTIALS_DIRECTORY`,
    /// else the config file's directory) and checks the keys: each of
    /// `trusted_keys` a deploy key's public key, each of `trusted_hosts` a
    /// host key's, `host_key` a private host seed.
    ///
    /// # Errors
    /// Every problem as `(key, message)`, one line that never holds a seed.
    pub(crate) fn resolve(&mut self, secrets: &Path) -> Result<(), Vec<(&'static str, String)>> {
        use crate::deploy::keys::{Role, public_key, read_seed};
        let mut problems = Vec::new();
        for k in &self.trusted_keys {
            if let Err(e) = public_key(k, Role::Deploy) {
                problems.push(("trusted_keys", e));
            }
        }
        for k in &self.trusted_hosts {
            if let Err(e) = public_key(k, Role::Host) {
                problems.push(("trusted_hosts", e));
            }
        }
        if let Some(path) = &mut self.host_key {
            *path = secrets.join(&*path);
            if let Err(e) = read_seed(path, Role::Host) {
                problems.push(("host_key", e));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

fn default_follow() -> bool {
    true
}
fn default_modules_bucket() -> String {
    "idem-modules".into()
}
fn default_deployments_bucket() -> String {
    "idem-deployments".into()
}
fn default_hosts_bucket() -> String {
    "idem-hosts".into()
}
fn default_shadows_bucket() -> String {
    "idem-shadows".into()
}
