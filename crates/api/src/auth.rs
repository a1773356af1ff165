//! Bearer-token authentication and role checks.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, web};
use agentry_domain::Role;
use base64::Engine;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::error::ApiError;
use crate::state::AppState;

/// Every token starts with this, so a leaked one is easy to recognise (and to scan for).
pub const TOKEN_PREFIX: &str = "agt_";
/// Longest bearer token read from a header; anything longer cannot be ours.
const MAX_TOKEN_LEN: usize = 256;

/// A new random API token: the prefix and 32 bytes from the OS's random source, base64url.
pub fn generate_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// The stored form of a token: lower-case hex SHA-256. Tokens carry 256 random bits, so a
/// fast hash is enough (no password stretching needed) and lookups stay one index probe.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's id.
    pub token_id: Uuid,
    /// The token's name.
    pub name: String,
    /// The token's role.
    pub role: Role,
}

impl Caller {
    /// Refuses with 403 unless the caller's role includes `role`.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this needs the {role} role; the token has {}",
                self.role
            )))
        }
    }
}

/// A role as a type, for extractors that require it of their caller (see
/// [`crate::routes::Target`]).
pub trait RequiredRole {
    /// The least role accepted.
    const LEAST: Role;
}

/// Any valid token (viewer and up).
#[derive(Debug)]
pub enum AnyRole {}

/// A member's or admin's token.
#[derive(Debug)]
pub enum MemberRole {}

/// An admin's token.
#[derive(Debug)]
pub enum AdminRole {}

impl RequiredRole for AnyRole {
    const LEAST: Role = Role::Viewer;
}

impl RequiredRole for MemberRole {
    const LEAST: Role = Role::Member;
}

impl RequiredRole for AdminRole {
    const LEAST: Role = Role::Admin;
}

/// The file `serve` writes the first admin token to (`$AGENTRY_DATA_DIR/admin-token`), so
/// that the plain-text token does not stay on disk longer than needed: it is removed the
/// first time that token authenticates a request (its owner evidently has it by then).
/// Registered as app data by `serve`; applications without it remove nothing.
#[derive(Debug)]
pub struct FirstTokenFile {
    token_id: Uuid,
    path: PathBuf,
    pending: AtomicBool,
}

impl FirstTokenFile {
    /// The file at `path` holding the token with id `token_id`.
    pub fn new(token_id: Uuid, path: PathBuf) -> Self {
        FirstTokenFile {
            token_id,
            path,
            pending: AtomicBool::new(true),
        }
    }

    /// Removes the file (once) if `token_id` is the token it holds.
    pub fn used_by(&self, token_id: Uuid) {
        if token_id != self.token_id || !self.pending.swap(false, Ordering::SeqCst) {
            return;
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => tracing::info!(
                file = %self.path.display(),
                "the first admin token has been used; its plain-text file is removed"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                file = %self.path.display(),
                error = %e,
                "could not remove the first admin token's file"
            ),
        }
    }
}

fn bearer(req: &HttpRequest) -> Result<String, ApiError> {
    let value = req
        .headers()
        .get(header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthenticated("missing Authorization: Bearer <token> header"))?;
    let value = value
        .to_str()
        .map_err(|_| ApiError::unauthenticated("the Authorization header is not valid text"))?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or_else(|| ApiError::unauthenticated("expected Authorization: Bearer <token>"))?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(ApiError::unauthenticated(
            "expected Authorization: Bearer <token>",
        ));
    }
    Ok(token.to_owned())
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Caller, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let token = bearer(req);
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let first_token_file = req.app_data::<web::Data<FirstTokenFile>>().cloned();
        Box::pin(async move {
            let token = token?;
            let state = state.ok_or_else(|| ApiError::internal(&"application state missing"))?;
            let hash = hash_token(&token);
            let found = state.service.token_by_hash(hash).await?;
            let token =
                found.ok_or_else(|| ApiError::unauthenticated("invalid or revoked token"))?;
            if let Some(file) = first_token_file {
                file.used_by(token.id);
            }
            Ok(Caller {
                token_id: token.id,
                name: token.name,
                role: token.role,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_random_and_hash_to_hex() {
        let a = generate_token().expect("random");
        let b = generate_token().expect("random");
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_ne!(a, b);
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43);
        let h = hash_token(&a);
        assert_eq!(h.len(), 64);
        assert!(
            h.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(
            hash_token("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
