//! The secret store: values encrypted at rest with AES-256-GCM (a random 96-bit nonce per
//! value, the secret's name as associated data, so a ciphertext cannot be moved to another
//! name), under a 32-byte master key that never enters the database.
//!
//! Plaintext exists only in [`SecretValue`], whose `Debug` is redacted, so a value cannot end
//! up in a log line by formatting a struct.

use std::fmt;
use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use diesel::prelude::*;
use time::{OffsetDateTime, PrimitiveDateTime};

use crate::convert::{from_db, to_db};
use crate::schema::secrets;
use crate::{AnyConnection, DbError, write_tx};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;
const NONCE_LEN: usize = 12;
/// Format tag of stored ciphertexts (`v1:` + base64 of nonce ‖ ciphertext ‖ tag).
const VERSION: &str = "v1:";

/// Why a key or a secret could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The master key is not 32 bytes of base64.
    #[error("the master key must be 32 bytes, base64-encoded: {0}")]
    BadKey(String),
    /// The key file could not be read or written.
    #[error("master key file {path}: {message}")]
    KeyFile {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// A stored value does not decrypt with this key (wrong key, or tampered data).
    #[error("secret {0:?} cannot be decrypted with this master key")]
    Undecryptable(String),
    /// The operating system's random source failed.
    #[error("no randomness available: {0}")]
    Random(String),
    /// A database error.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl From<diesel::result::Error> for SecretError {
    fn from(e: diesel::result::Error) -> Self {
        SecretError::Db(e.into())
    }
}

/// A decrypted secret value. Its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wraps a plaintext value.
    pub fn new(value: impl Into<String>) -> Self {
        SecretValue(value.into())
    }

    /// The plaintext; call only where the value is used (a request header, a git process).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The master key: encrypts and decrypts secret values.
#[derive(Clone)]
pub struct MasterKey {
    cipher: Aes256Gcm,
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl MasterKey {
    /// A key from its base64 text (`AGENTRY_MASTER_KEY`).
    pub fn from_base64(text: &str) -> Result<MasterKey, SecretError> {
        let bytes = B64
            .decode(text.trim())
            .map_err(|e| SecretError::BadKey(e.to_string()))?;
        if bytes.len() != 32 {
            return Err(SecretError::BadKey(format!("got {} bytes", bytes.len())));
        }
        let cipher =
            Aes256Gcm::new_from_slice(&bytes).map_err(|e| SecretError::BadKey(e.to_string()))?;
        Ok(MasterKey { cipher })
    }

    /// A new random key (tests, and tools that need a throwaway key).
    pub fn generate() -> Result<MasterKey, SecretError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| SecretError::Random(e.to_string()))?;
        MasterKey::from_base64(&B64.encode(bytes))
    }

    /// The key from `configured` (the environment's value) if given; otherwise from the key
    /// file at `path`, generating it (32 random bytes, base64, mode 0600) on first use.
    pub fn load_or_create(configured: Option<&str>, path: &Path) -> Result<MasterKey, SecretError> {
        if let Some(text) = configured {
            return MasterKey::from_base64(text);
        }
        let file_error = |e: std::io::Error| SecretError::KeyFile {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        match std::fs::read_to_string(path) {
            Ok(text) => MasterKey::from_base64(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut bytes = [0u8; 32];
                getrandom::fill(&mut bytes).map_err(|e| SecretError::Random(e.to_string()))?;
                let text = B64.encode(bytes);
                // The key is written whole to a private (0600) temporary file beside the
                // target and then linked into place without replacing anything: a process
                // starting at the same moment sees either no file or the complete key, and
                // only one key is ever published.
                let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
                let mut file = tempfile::NamedTempFile::new_in(dir.unwrap_or(Path::new(".")))
                    .map_err(file_error)?;
                {
                    use std::io::Write;
                    file.write_all(format!("{text}\n").as_bytes())
                        .map_err(file_error)?;
                    file.as_file().sync_all().map_err(file_error)?;
                }
                match file.persist_noclobber(path) {
                    Ok(_) => MasterKey::from_base64(&text),
                    Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
                        MasterKey::from_base64(&std::fs::read_to_string(path).map_err(file_error)?)
                    }
                    Err(e) => Err(file_error(e.error)),
                }
            }
            Err(e) => Err(file_error(e)),
        }
    }

    /// Encrypts `value` for the secret `name`.
    pub fn seal(&self, name: &str, value: &SecretValue) -> Result<String, SecretError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| SecretError::Random(e.to_string()))?;
        let sealed = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: value.expose().as_bytes(),
                    aad: name.as_bytes(),
                },
            )
            .map_err(|_| SecretError::Undecryptable(name.to_owned()))?;
        let mut out = Vec::with_capacity(NONCE_LEN + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(format!("{VERSION}{}", B64.encode(out)))
    }

    /// Decrypts a value sealed for the secret `name`.
    pub fn open(&self, name: &str, sealed: &str) -> Result<SecretValue, SecretError> {
        let bad = || SecretError::Undecryptable(name.to_owned());
        let bytes = B64
            .decode(sealed.strip_prefix(VERSION).ok_or_else(bad)?)
            .map_err(|_| bad())?;
        if bytes.len() < NONCE_LEN {
            return Err(bad());
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let plain = self
            .cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: name.as_bytes(),
                },
            )
            .map_err(|_| bad())?;
        String::from_utf8(plain).map(SecretValue).map_err(|_| bad())
    }
}

/// A stored secret's metadata (never its value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretInfo {
    /// The name.
    pub name: String,
    /// When it was first stored.
    pub created_at: OffsetDateTime,
    /// When its value last changed.
    pub updated_at: OffsetDateTime,
}

/// Stores (or replaces) a secret; returns its metadata.
pub fn put(
    conn: &mut AnyConnection,
    key: &MasterKey,
    name: &str,
    value: &SecretValue,
    now: OffsetDateTime,
) -> Result<SecretInfo, SecretError> {
    let sealed = key.seal(name, value)?;
    write_tx(conn, |conn| {
        let update = |conn: &mut AnyConnection| {
            diesel::update(secrets::table.find(name))
                .set((
                    secrets::ciphertext.eq(&sealed),
                    secrets::updated_at.eq(to_db(now)),
                ))
                .execute(conn)
        };
        if update(conn)? == 0 {
            let inserted = crate::connection::insert_once(conn, |conn| {
                diesel::insert_into(secrets::table)
                    .values((
                        secrets::name.eq(name),
                        secrets::ciphertext.eq(&sealed),
                        secrets::created_at.eq(to_db(now)),
                        secrets::updated_at.eq(to_db(now)),
                    ))
                    .execute(conn)
            })?;
            // Another replica stored the same new name at the same moment: this value,
            // written last, replaces it (as a later `put` would).
            if !inserted {
                update(conn)?;
            }
        }
        info(conn, name)?.ok_or(SecretError::Db(DbError::NotFound))
    })
}

/// The decrypted value of a secret, if stored.
pub fn get(
    conn: &mut AnyConnection,
    key: &MasterKey,
    name: &str,
) -> Result<Option<SecretValue>, SecretError> {
    let sealed: Option<String> = secrets::table
        .find(name)
        .select(secrets::ciphertext)
        .first(conn)
        .optional()?;
    sealed.map(|s| key.open(name, &s)).transpose()
}

fn info(conn: &mut AnyConnection, name: &str) -> Result<Option<SecretInfo>, SecretError> {
    let row: Option<(String, PrimitiveDateTime, PrimitiveDateTime)> = secrets::table
        .find(name)
        .select((secrets::name, secrets::created_at, secrets::updated_at))
        .first(conn)
        .optional()?;
    Ok(row.map(|(name, c, u)| SecretInfo {
        name,
        created_at: from_db(c),
        updated_at: from_db(u),
    }))
}

/// Every stored secret's metadata, by name.
pub fn list(conn: &mut AnyConnection) -> Result<Vec<SecretInfo>, SecretError> {
    let rows: Vec<(String, PrimitiveDateTime, PrimitiveDateTime)> = secrets::table
        .order(secrets::name.asc())
        .select((secrets::name, secrets::created_at, secrets::updated_at))
        .load(conn)?;
    Ok(rows
        .into_iter()
        .map(|(name, c, u)| SecretInfo {
            name,
            created_at: from_db(c),
            updated_at: from_db(u),
        })
        .collect())
}

/// Deletes a secret; `false` when there was none.
pub fn delete(conn: &mut AnyConnection, name: &str) -> Result<bool, SecretError> {
    Ok(diesel::delete(secrets::table.find(name)).execute(conn)? == 1)
}
