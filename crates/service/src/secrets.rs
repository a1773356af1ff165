//! Stored secrets (docs/contract.md#33-secrets), encrypted with the master key: storing one
//! (the code-host token is checked with the code host first), their names and dates,
//! deleting one, and reading the code-host token, the one secret the service itself uses.

use agentry_persistence::secrets::{self, SecretInfo, SecretValue};

use crate::{Service, ServiceError, now};

/// The secret holding the code-host token.
pub const TOKEN_SECRET: &str = "CODEHOST_TOKEN";

/// The secrets sent as HTTP header values (the code-host token, the model providers' keys):
/// stored only when every character is visible ASCII.
const HEADER_SECRETS: [&str; 3] = [
    TOKEN_SECRET,
    agentry_agent_network::gateway::ANTHROPIC_KEY,
    agentry_agent_network::gateway::OPENAI_KEY,
];

impl Service {
    /// Stores (or replaces) a secret, encrypted. A secret sent as a header value (the
    /// code-host token, a model key) must be visible ASCII; the code-host token is checked
    /// with the code host first and refused ([`ServiceError::CodeHostRejected`]) if it does
    /// not work; nothing is stored then.
    pub async fn store_secret(
        &self,
        name: String,
        value: SecretValue,
    ) -> Result<SecretInfo, ServiceError> {
        if HEADER_SECRETS.contains(&name.as_str())
            && !value.expose().bytes().all(|b| b.is_ascii_graphic())
        {
            // Sent as an HTTP header value: anything else fails every request that uses it.
            return Err(ServiceError::invalid(
                "value",
                format!(
                    "{name} is sent in an HTTP header: visible ASCII characters only, with no \
                     space, line break or other control character"
                ),
            ));
        }
        if name == TOKEN_SECRET {
            let user = self.parts.codehost.check_token(&value).await?;
            tracing::info!(login = %user.login, "code-host token accepted");
        }
        let key = self.master_key().clone();
        self.db(move |conn| Ok(secrets::put(conn, &key, &name, &value, now())?))
            .await
    }

    /// The stored secrets' names and dates (never their values), by name.
    pub async fn secrets(&self) -> Result<Vec<SecretInfo>, ServiceError> {
        self.db(|conn| Ok(secrets::list(conn)?)).await
    }

    /// Deletes secret `name`; [`ServiceError::NotFound`] when there is none of that name.
    pub async fn delete_secret(&self, name: String) -> Result<(), ServiceError> {
        let message = format!("secret {name} not found");
        let deleted = self
            .db(move |conn| Ok(secrets::delete(conn, &name)?))
            .await?;
        deleted.then_some(()).ok_or(ServiceError::NotFound(message))
    }

    /// The stored code-host token, decrypted; 412 `codehost_token_missing` without one.
    pub(crate) async fn codehost_token(&self) -> Result<SecretValue, ServiceError> {
        let key = self.master_key().clone();
        self.db(move |conn| Ok(secrets::get(conn, &key, TOKEN_SECRET)?))
            .await?
            .ok_or(ServiceError::CodeHostTokenMissing)
    }
}
