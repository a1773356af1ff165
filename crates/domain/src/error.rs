//! Validation errors that name the offending field.

/// A validation error about one field of a request or document.
///
/// `field` is the JSON member name as the client wrote it (camelCase), or a
/// pseudo-field such as `"body"` when the whole document is wrong; `message`
/// is a sentence fragment saying what is allowed. Displayed as
/// `"{field}: {message}"`, e.g. `"maxTurnsReview: must be an integer from 1
/// to 1000"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// The JSON member name (camelCase) the error is about.
    pub field: String,
    /// What is wrong with it, or what would be allowed.
    pub message: String,
}

impl FieldError {
    /// Creates an error about `field` with the given `message`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_field() {
        let e = FieldError::new("maxTurnsReview", "must be an integer from 1 to 1000");
        assert_eq!(
            e.to_string(),
            "maxTurnsReview: must be an integer from 1 to 1000"
        );
        assert_eq!(e.field, "maxTurnsReview");
    }
}
