//! Stored secrets as admins see them (docs/contract.md#33-secrets): their names and dates,
//! and deleting one. Storing a secret checks it with the code host, so it lives with the
//! code-host use cases ([`Service::store_secret`]).

use agentry_persistence::secrets::{self, SecretInfo};

use crate::{Service, ServiceError};

impl Service {
    /// The stored secrets' names and dates (never their values), by name.
    pub async fn secrets(&self) -> Result<Vec<SecretInfo>, ServiceError> {
        self.db(|conn| Ok(secrets::list(conn)?)).await
    }

    /// Deletes secret `name`; `false` when there is none of that name.
    pub async fn delete_secret(&self, name: String) -> Result<bool, ServiceError> {
        self.db(move |conn| Ok(secrets::delete(conn, &name)?)).await
    }
}
