//! Reading the JSON answers of agentry's API in tests.

use serde_json::Value;

/// The string `field` of each element of the array `value[list]`, in order (e.g. the
/// outcome of each of a task's model calls).
///
/// # Panics
///
/// When `value[list]` is not an array, or an element's `field` is not a string.
pub fn strings_of<'a>(value: &'a Value, list: &str, field: &str) -> Vec<&'a str> {
    value[list]
        .as_array()
        .unwrap_or_else(|| panic!("no array `{list}` in {value}"))
        .iter()
        .map(|e| {
            e[field]
                .as_str()
                .unwrap_or_else(|| panic!("no string `{field}` in {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::strings_of;

    #[test]
    fn reads_one_field_of_each_element() {
        let calls =
            serde_json::json!({"calls": [{"outcome": "completed"}, {"outcome": "refused"}]});
        assert_eq!(
            strings_of(&calls, "calls", "outcome"),
            ["completed", "refused"]
        );
    }
}
