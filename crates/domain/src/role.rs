//! API roles. Each role includes the rights of the ones before it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::task::UnknownValue;

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

impl Role {
    /// All roles, least privileged first.
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Member, Role::Admin];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = UnknownValue;

    fn from_str(s: &str) -> Result<Role, UnknownValue> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownValue {
                kind: "role",
                value: s.to_owned(),
                expected: "viewer, member, admin".to_owned(),
            })
    }
}

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
