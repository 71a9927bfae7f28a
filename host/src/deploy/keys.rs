//! The NKeys of hot deploy (ed25519, as the `nkeys` crate and `nk` write
//! them): a **deploy key**, with which `idem deploy` signs the deployments
//! it records (a module key: seed `SM…`, public key `M…`), and a **host
//! key**, with which a host signs its reports to the hosts bucket (a server
//! key: seed `SN…`, public key `N…`). Each role has its own kind, so a key
//! of one is never taken for the other, nor for a NATS user's.
//!
//! A seed file is refused when another user may read or write it: whoever
//! reads a deploy key's seed decides what every host runs.

use nkeys::{KeyPair, KeyPairType};
use std::path::Path;

/// What a key is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Signs deployments (`idem deploy --key`, `[deploy] trusted_keys`).
    Deploy,
    /// Signs a host's reports (`[deploy] host_key`, `trusted_hosts`).
    Host,
}

impl Role {
    fn kind(self) -> KeyPairType {
        match self {
            Role::Deploy => KeyPairType::Module,
            Role::Host => KeyPairType::Server,
        }
    }

    /// `deploy key` or `host key`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Deploy => "deploy key",
            Role::Host => "host key",
        }
    }

    /// The first letter of this role's public keys (`M` or `N`).
    pub fn public_prefix(self) -> char {
        match self {
            Role::Deploy => 'M',
            Role::Host => 'N',
        }
    }

    fn make(self) -> KeyPair {
        KeyPair::new(self.kind())
    }
}

/// The key pair of the seed in `path`.
///
/// # Errors
/// One line that never contains the seed: the file cannot be read, group
/// or others may read or write it, or it holds no seed of `role`'s kind.
pub fn read_seed(path: &Path, role: Role) -> Result<KeyPair, String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the {} {}: {e}", role.name(), path.display()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "the {} {} may be read by other users (mode {:o}); whoever reads it can sign as you: chmod 600 it",
            role.name(),
            path.display(),
            meta.mode() & 0o777
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the {} {}: {e}", role.name(), path.display()))?;
    let pair = KeyPair::from_seed(text.trim()).map_err(|_| {
        format!(
            "{} holds no NKey seed (`idem keygen{} FILE` makes one)",
            path.display(),
            if role == Role::Host { " --host" } else { "" }
        )
    })?;
    if pair.key_pair_type() != role.kind() {
        return Err(format!(
            "{} holds the seed of a {:?} key, not of a {} (its seed starts with S{}; `idem keygen{} FILE` makes one)",
            path.display(),
            pair.key_pair_type(),
            role.name(),
            role.public_prefix(),
            if role == Role::Host { " --host" } else { "" }
        ));
    }
    Ok(pair)
}

/// A public key of `role`'s kind, as `[deploy] trusted_keys` and
/// `trusted_hosts` list them.
///
/// # Errors
/// One line naming the key (escaped, cut short): not a public NKey, or of
/// another kind.
pub fn public_key(text: &str, role: Role) -> Result<KeyPair, String> {
    let shown = super::record::bounded(text);
    let pair = KeyPair::from_public_key(text).map_err(|_| {
        format!(
            "`{shown}` is not a public NKey (a {} starts with {} and has 56 characters; `idem keygen` prints it)",
            role.name(),
            role.public_prefix()
        )
    })?;
    if pair.key_pair_type() != role.kind() {
        return Err(format!(
            "`{shown}` is the public key of a {:?} key, not of a {} (which starts with {})",
            pair.key_pair_type(),
            role.name(),
            role.public_prefix()
        ));
    }
    Ok(pair)
}

/// Makes a new key of `role`'s kind, writes its seed to `path` (a new file,
/// mode 0600) and returns its public key.
///
/// # Errors
/// One line: `path` exists (it is never overwritten) or cannot be written.
pub fn generate(path: &Path, role: Role) -> Result<String, String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let pair = role.make();
    let seed = pair
        .seed()
        .map_err(|e| format!("cannot make a {}: {e}", role.name()))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!(
                    "{} exists; it is never overwritten (a key lost is a key to distrust): choose another file",
                    path.display()
                )
            } else {
                format!("cannot create {}: {e}", path.display())
            }
        })?;
    file.write_all(format!("{seed}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(pair.public_key())
}

/// Hex of `pair`'s signature of `bytes`.
pub fn sign(pair: &KeyPair, bytes: &[u8]) -> Result<String, String> {
    pair.sign(bytes)
        .map(hex::encode)
        .map_err(|e| format!("cannot sign: {e}"))
}

/// Whether `signature` (hex) is `pair`'s signature of `bytes`.
pub fn verifies(pair: &KeyPair, bytes: &[u8], signature: &str) -> bool {
    hex::decode(signature).is_ok_and(|sig| sig.len() == 64 && pair.verify(bytes, &sig).is_ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_generated_seed_is_private_read_back_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deploy.nk");
        let public = generate(&path, Role::Deploy).unwrap();
        assert!(public.starts_with('M') && public.len() == 56, "{public}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_seed(&path, Role::Deploy).unwrap().public_key(), public);
        assert_eq!(
            generate(&path, Role::Deploy).unwrap_err(),
            format!(
                "{} exists; it is never overwritten (a key lost is a key to distrust): choose another file",
                path.display()
            )
        );
        let err = read_seed(&path, Role::Host).unwrap_err();
        assert_eq!(
            err,
            format!(
                "{} holds the seed of a Module key, not of a host key (its seed starts with SN; `idem keygen --host FILE` makes one)",
                path.display()
            )
        );
        assert!(!err.contains(&public));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(
            read_seed(&path, Role::Deploy).unwrap_err(),
            format!(
                "the deploy key {} may be read by other users (mode 640); whoever reads it can sign as you: chmod 600 it",
                path.display()
            )
        );
    }

    #[test]
    fn public_keys_are_of_their_role() {
        let deploy = KeyPair::new_module().public_key();
        let host = KeyPair::new_server().public_key();
        assert!(public_key(&deploy, Role::Deploy).is_ok());
        assert!(public_key(&host, Role::Host).is_ok());
        assert_eq!(
            public_key(&host, Role::Deploy).unwrap_err(),
            format!(
                "`{host}` is the public key of a Server key, not of a deploy key (which starts with M)"
            )
        );
        assert_eq!(
            public_key("nope\n", Role::Host).unwrap_err(),
            "`nope\\n` is not a public NKey (a host key starts with N and has 56 characters; `idem keygen` prints it)"
        );
    }

    #[test]
    fn a_signature_verifies_only_for_its_bytes_and_key() {
        let pair = KeyPair::new_module();
        let other = KeyPair::new_module();
        let sig = sign(&pair, b"abc").unwrap();
        assert!(verifies(&pair, b"abc", &sig));
        assert!(!verifies(&pair, b"abd", &sig));
        assert!(!verifies(&other, b"abc", &sig));
        assert!(!verifies(&pair, b"abc", "zz"));
        assert!(!verifies(&pair, b"abc", ""));
    }
}
