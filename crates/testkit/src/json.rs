//! Reading the JSON answers of agentry's API in tests.

use serde_json::Value;

/// The members of the cost report (`GET /api/analytics/costs`) that list rows: empty where
/// no task matches.
pub const COST_REPORT_LISTS: [&str; 6] = [
    "costByRepo",
    "costByType",
    "costByModel",
    "anomalies",
    "modelSuggestions",
    "topTasks",
];

/// The elements of the array `value[list]` (e.g. a task's events).
///
/// # Panics
///
/// When `value[list]` is not an array.
pub fn elements_of<'a>(value: &'a Value, list: &str) -> &'a [Value] {
    value[list]
        .as_array()
        .unwrap_or_else(|| panic!("no array `{list}` in {value}"))
}

/// The string `field` of each element of the array `value[list]`, in order (e.g. the
/// outcome of each of a task's model calls).
///
/// # Panics
///
/// When `value[list]` is not an array, or an element's `field` is not a string.
pub fn strings_of<'a>(value: &'a Value, list: &str, field: &str) -> Vec<&'a str> {
    elements_of(value, list)
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
    use super::{elements_of, strings_of};

    #[test]
    fn reads_one_field_of_each_element() {
        let calls =
            serde_json::json!({"calls": [{"outcome": "completed"}, {"outcome": "refused"}]});
        assert_eq!(
            strings_of(&calls, "calls", "outcome"),
            ["completed", "refused"]
        );
        assert_eq!(elements_of(&calls, "calls").len(), 2);
    }

    #[test]
    #[should_panic(expected = "no array `calls`")]
    fn a_missing_list_is_named() {
        elements_of(&serde_json::json!({"call": []}), "calls");
    }
}
