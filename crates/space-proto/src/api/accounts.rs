//! The account an exec, a terminal or an upload runs as.

use serde::{Deserialize, Serialize};

/// An account of a sandbox: a user name of its `/etc/passwd` (`"user"`) or a uid
/// (`1000`). Exec, terminals and uploads as it get its uid, groups and home; a uid
/// the sandbox does not name runs with group = uid and home `/`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum User {
    /// A uid.
    Uid(u32),
    /// A user name.
    Name(String),
}

impl User {
    /// The account a query parameter or a command-line flag names: digits are a uid,
    /// anything else a name.
    pub fn parse(text: &str) -> Self {
        match text.parse::<u32>() {
            Ok(uid) if text.bytes().all(|b| b.is_ascii_digit()) => Self::Uid(uid),
            _ => Self::Name(text.to_owned()),
        }
    }

    /// Its form in a query string (`user=…`).
    pub fn as_query(&self) -> String {
        match self {
            Self::Uid(u) => u.to_string(),
            Self::Name(n) => n.clone(),
        }
    }
}

impl From<User> for crate::guest::Account {
    fn from(u: User) -> Self {
        match u {
            User::Uid(uid) => Self::Uid(uid),
            User::Name(name) => Self::Name(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::User;

    #[test]
    fn a_user_is_a_json_name_or_number_and_digits_on_a_command_line_are_a_uid() {
        let name: User = serde_json::from_str("\"user\"").unwrap();
        assert_eq!(name, User::Name("user".into()));
        let uid: User = serde_json::from_str("1000").unwrap();
        assert_eq!(uid, User::Uid(1000));
        assert!(serde_json::from_str::<User>("-1").is_err());
        assert_eq!(User::parse("1000"), User::Uid(1000));
        assert_eq!(User::parse("+1000"), User::Name("+1000".into()));
        assert_eq!(User::parse("user"), User::Name("user".into()));
        assert_eq!(User::parse("99999999999"), User::Name("99999999999".into()));
    }
}
