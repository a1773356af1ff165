//! The read shapes every module runs, once: all rows of a query decoded into their domain
//! values, the first row decoded (or `None`), and a row that must exist
//! ([`DbError::NotFound`] otherwise).
//!
//! A row type decodes through its `TryFrom` implementation (with [`DbError::Corrupt`] for a
//! stored value that does not decode); the row type follows from the query's
//! `select(Row::as_select())`, so call sites name neither.

use diesel::OptionalExtension;
use diesel::dsl::Limit;
use diesel::query_dsl::methods::LimitDsl;
use diesel::query_dsl::{LoadQuery, RunQueryDsl};

use crate::{AnyConnection, DbError};

/// Reads of a query whose rows decode into domain values; implemented for every query.
pub(crate) trait Fetch: RunQueryDsl<AnyConnection> + Sized {
    /// Every row, each decoded.
    fn load_as<'q, R, T>(self, conn: &mut AnyConnection) -> Result<Vec<T>, DbError>
    where
        Self: LoadQuery<'q, AnyConnection, R>,
        T: TryFrom<R, Error = DbError>,
    {
        self.load::<R>(conn)?.into_iter().map(T::try_from).collect()
    }

    /// The first row, decoded; `None` when there is none.
    fn first_as<'q, R, T>(self, conn: &mut AnyConnection) -> Result<Option<T>, DbError>
    where
        Self: LimitDsl,
        Limit<Self>: LoadQuery<'q, AnyConnection, R>,
        T: TryFrom<R, Error = DbError>,
    {
        self.first::<R>(conn)
            .optional()?
            .map(T::try_from)
            .transpose()
    }

    /// The first row, decoded; [`DbError::NotFound`] when there is none.
    fn get_as<'q, R, T>(self, conn: &mut AnyConnection) -> Result<T, DbError>
    where
        Self: LimitDsl,
        Limit<Self>: LoadQuery<'q, AnyConnection, R>,
        T: TryFrom<R, Error = DbError>,
    {
        self.first_as(conn)?.ok_or(DbError::NotFound)
    }

    /// The first row as it is; [`DbError::NotFound`] when there is none.
    fn existing<'q, R>(self, conn: &mut AnyConnection) -> Result<R, DbError>
    where
        Self: LimitDsl,
        Limit<Self>: LoadQuery<'q, AnyConnection, R>,
    {
        self.first::<R>(conn).optional()?.ok_or(DbError::NotFound)
    }
}

impl<Q: RunQueryDsl<AnyConnection>> Fetch for Q {}
