//! Connected repositories as admins see them (docs/contract.md#34-repositories): list them,
//! read one, disconnect one. Connecting one checks it with the code host, so it lives with
//! the code-host use cases ([`Service::connect_repository`]).

use agentry_persistence::DbError;
use agentry_persistence::repos::{self, Repository};
use uuid::Uuid;

use crate::{Service, ServiceError, now};

/// A storage error about repository `id` ([`ServiceError::NotFound`] naming it).
fn about_repository(id: Uuid) -> impl Fn(DbError) -> ServiceError {
    move |e| match e {
        DbError::NotFound => ServiceError::NotFound(format!("repository {id} not found")),
        other => other.into(),
    }
}

impl Service {
    /// The connected repositories, by URL.
    pub async fn connected_repositories(&self) -> Result<Vec<Repository>, ServiceError> {
        self.db(|conn| Ok(repos::list_connected(conn)?)).await
    }

    /// Repository `id`, connected or not.
    pub async fn repository(&self, id: Uuid) -> Result<Repository, ServiceError> {
        self.db(move |conn| repos::get_repository(conn, id).map_err(about_repository(id)))
            .await
    }

    /// Disconnects repository `id`: no more syncs or runs; its tasks and costs stay.
    pub async fn disconnect_repository(&self, id: Uuid) -> Result<Repository, ServiceError> {
        self.db(move |conn| {
            repos::disconnect_repository(conn, id, now()).map_err(about_repository(id))
        })
        .await
    }
}
