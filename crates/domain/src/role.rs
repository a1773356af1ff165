//! API roles. Each role includes the rights of the ones before it.

use serde::{Deserialize, Serialize};

/// What an API token may do: `viewer` reads; `member` also assigns, creates, cancels and
/// retries tasks; `admin` also manages secrets, repositories, settings, imports and tokens.
/// Ordered, so `role >= Role::Member` asks "may this token do member things".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read-only access.
    Viewer,
    /// Reads, and works with tasks and issues.
    Member,
    /// Everything, including configuration.
    Admin,
}

crate::wire_enum!(Role, "role", [
    Viewer => "viewer",
    Member => "member",
    Admin => "admin",
]);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_by_privilege() {
        assert!(Role::Viewer < Role::Member && Role::Member < Role::Admin);
    }

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        }
        assert!("root".parse::<Role>().is_err());
        assert!("Admin".parse::<Role>().is_err());
    }
}
