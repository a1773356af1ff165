//! The paging parameters of the cursor-paginated lists, `limit` and `cursor`, each defined
//! once for the OpenAPI document (as `params(...)` of `#[utoipa::path]`) and, for `limit`,
//! for reading it from the query string, so that the two cannot drift apart.

use utoipa::IntoParams;
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::openapi::{KnownFormat, ObjectBuilder, SchemaFormat, Type};

use crate::error::ApiError;
use crate::query::Query;
use crate::routes::parameter;

/// `limit`: the page size, from 1 to `MAX`; `DEFAULT` when it is not given.
pub struct Limit<const DEFAULT: i64, const MAX: i64>;

impl<const DEFAULT: i64, const MAX: i64> Limit<DEFAULT, MAX> {
    /// The page size `q` asks for; 400 `invalid_parameter` outside 1 to `MAX`.
    pub fn read(q: &Query) -> Result<i64, ApiError> {
        Ok(q.int_in("limit", 1, MAX)?.unwrap_or(DEFAULT))
    }
}

impl<const DEFAULT: i64, const MAX: i64> IntoParams for Limit<DEFAULT, MAX> {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let schema = ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
            .maximum(Some(MAX));
        vec![parameter(
            "limit",
            ParameterIn::Query,
            format!("Page size, 1 to {MAX} (default {DEFAULT})"),
            schema,
        )]
    }
}

/// `cursor`: the `nextCursor` of the previous page, an opaque token
/// (see [`cursor`](super::cursor)).
pub struct OpaqueCursor;

impl IntoParams for OpaqueCursor {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[A-Za-z0-9_-]+$"));
        vec![parameter("cursor", ParameterIn::Query, CURSOR, schema)]
    }
}

/// `cursor`: the `nextCursor` of the previous page, the id of that page's last item.
pub struct IdCursor;

impl IntoParams for IdCursor {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        let schema = ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)));
        vec![parameter("cursor", ParameterIn::Query, CURSOR, schema)]
    }
}

/// What a `cursor` parameter is.
const CURSOR: &str = "`nextCursor` of the previous page, unchanged";
