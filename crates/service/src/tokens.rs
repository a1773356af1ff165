//! API tokens (docs/contract.md#310-api-tokens): create, list and revoke them, find the active
//! token of a presented hash, and issue the first admin token of an installation. The
//! service stores only the tokens' hashes; making and hashing a token is the adapter's.

use agentry_domain::Role;
use agentry_persistence::tokens::{self, ApiToken};
use uuid::Uuid;

use crate::{Service, ServiceError, now};

impl Service {
    /// Stores a new active token named `name` with `role`, by the hash of its secret.
    pub async fn create_token(
        &self,
        name: String,
        role: Role,
        token_hash: String,
    ) -> Result<ApiToken, ServiceError> {
        self.db(move |conn| Ok(tokens::create_token(conn, &name, role, &token_hash, now())?))
            .await
    }

    /// The active (not revoked) tokens, oldest first.
    pub async fn active_tokens(&self) -> Result<Vec<ApiToken>, ServiceError> {
        self.db(|conn| Ok(tokens::list_active(conn)?)).await
    }

    /// The active token whose secret hashes to `token_hash`, if any.
    pub async fn token_by_hash(
        &self,
        token_hash: String,
    ) -> Result<Option<ApiToken>, ServiceError> {
        self.db(move |conn| Ok(tokens::find_by_hash(conn, &token_hash)?))
            .await
    }

    /// Revokes token `id`; [`ServiceError::NotFound`] when no active token has that id.
    pub async fn revoke_token(&self, id: Uuid) -> Result<(), ServiceError> {
        let revoked = self
            .db(move |conn| Ok(tokens::revoke(conn, id, now())?))
            .await?;
        revoked
            .then_some(())
            .ok_or_else(|| ServiceError::NotFound(format!("token {id} not found")))
    }

    /// On an installation that never had a token, stores an admin token named `name` by the
    /// hash of its secret and returns it; `None` (and nothing stored) otherwise.
    pub async fn bootstrap_admin_token(
        &self,
        name: String,
        token_hash: String,
    ) -> Result<Option<ApiToken>, ServiceError> {
        self.db(move |conn| Ok(tokens::bootstrap_admin(conn, &name, &token_hash, now())?))
            .await
    }
}
