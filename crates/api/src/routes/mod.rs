//! HTTP handlers, one module per resource. Every handler is annotated for OpenAPI and
//! registered through `utoipa_actix_web`, so registering a route documents it.

pub mod analytics;
pub mod budget;
mod cursor;
pub mod health;
pub mod issues;
pub mod me;
mod page;
pub mod repos;
pub mod secrets;
pub mod tasks;
pub mod tokens;
pub mod webhooks;

use std::collections::BTreeMap;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, HttpResponse, ResponseError, web};
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::{
    ContentBuilder, KnownFormat, ObjectBuilder, Ref, RefOr, Required, Response, ResponseBuilder,
    SchemaFormat, Type,
};
use utoipa::{IntoParams, IntoResponses};
use uuid::Uuid;

use crate::auth::{AnyRole, Caller, RequiredRole};
use crate::error::ApiError;

/// Parses a path segment as a UUID, naming the parameter on failure.
pub(crate) fn path_uuid(name: &str, value: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(value).map_err(|_| ApiError::invalid_parameter(name, "must be a UUID"))
}

/// The one parameter in a route's path: how it is read from its (percent-decoded) text, and
/// (as [`IntoParams`], for `params(...)` of `#[utoipa::path]`) how the document describes it,
/// declared once for every route that takes it.
pub trait PathParam: IntoParams {
    /// What the parameter reads as.
    type Value;

    /// The parameter, or the 400 naming it.
    fn parse(segment: &str) -> Result<Self::Value, ApiError>;

    /// The parameter read from the request's path.
    fn read(req: &HttpRequest) -> Result<Self::Value, ApiError> {
        let segment = web::Path::<String>::extract(req)
            .into_inner()
            .map(web::Path::into_inner)
            .unwrap_or_default();
        Self::parse(&segment)
    }
}

/// No path parameter: a route on a collection, or on the instance.
#[derive(Debug)]
pub struct NoId;

impl PathParam for NoId {
    type Value = ();

    fn parse(_: &str) -> Result<(), ApiError> {
        Ok(())
    }

    fn read(_: &HttpRequest) -> Result<(), ApiError> {
        Ok(())
    }
}

impl IntoParams for NoId {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        Vec::new()
    }
}

/// A parameter of the document: in the path (required) or in the query (optional).
pub(crate) fn parameter(
    name: &str,
    location: ParameterIn,
    description: impl Into<String>,
    schema: ObjectBuilder,
) -> Parameter {
    let required = match location {
        ParameterIn::Path => Required::True,
        _ => Required::False,
    };
    ParameterBuilder::new()
        .name(name)
        .parameter_in(location)
        .required(required)
        .description(Some(description))
        .schema(Some(schema))
        .build()
}

/// Declares path parameters `{id}` that are UUIDs, each with its description in the
/// document.
macro_rules! uuid_ids {
    ($($(#[doc = $doc:literal])+ $name:ident: $description:literal;)+) => {$(
        $(#[doc = $doc])+
        pub struct $name;

        impl PathParam for $name {
            type Value = Uuid;

            fn parse(segment: &str) -> Result<Uuid, ApiError> {
                path_uuid("id", segment)
            }
        }

        impl IntoParams for $name {
            fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
                let schema = ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Uuid)));
                vec![parameter("id", ParameterIn::Path, $description, schema)]
            }
        }
    )+};
}

uuid_ids! {
    /// `{id}`: a task's id.
    TaskId: "Task id";
    /// `{id}`: a repository's id.
    RepoId: "Repository id";
    /// `{id}`: an API token's id.
    TokenId: "Token id";
}

/// A request by a caller authenticated and holding at least the role `R` (401, then 403), on
/// the resource the path parameter `P` names ([`NoId`] for none; 400 if malformed), with what
/// it carries, `B`: nothing (`()`) or a body such as [`JsonBody`] (its own 400 or 413). The
/// checks answer in that order.
///
/// The body is read only once the caller is authorized and the id parsed: a handler's own
/// extractors run concurrently, so a body among them would answer 400 or 413 before the
/// token is looked up, and would be read for a caller who may not call the route. `B`'s
/// `from_request` must do no more than take the payload; its future does the reading.
///
/// [`JsonBody`]: crate::body::JsonBody
#[derive(Debug)]
pub struct Authorized<R = AnyRole, B = (), P: PathParam = NoId> {
    /// The caller.
    pub caller: Caller,
    /// The resource's identifier from the path.
    pub id: P::Value,
    /// What the request carries, read after the checks above.
    pub body: B,
    role: PhantomData<R>,
}

/// A request on one resource, named by the path parameter `P`: [`Authorized`] with the
/// parameters in the order a route reads them.
pub type Target<R, P, B = ()> = Authorized<R, B, P>;

impl<R, B, P> FromRequest for Authorized<R, B, P>
where
    R: RequiredRole + 'static,
    B: FromRequest + 'static,
    B::Error: Into<ApiError>,
    P: PathParam + 'static,
{
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let caller = Caller::from_request(req, payload);
        let id = P::read(req);
        let body = B::from_request(req, payload);
        Box::pin(async move {
            let caller = caller.await?;
            caller.require(R::LEAST)?;
            Ok(Authorized {
                caller,
                id: id?,
                body: body.await.map_err(Into::into)?,
                role: PhantomData,
            })
        })
    }
}

/// The document's entry for an error answer: the JSON envelope ([`ErrorBody`]).
///
/// [`ErrorBody`]: crate::error::ErrorBody
fn error_response(status: u16) -> RefOr<Response> {
    let description = match status {
        412 => "No CODEHOST_TOKEN stored",
        413 => "The body is over 1 MiB",
        422 => "The code host refused: a bad token, no access, or an unknown repository",
        503 => {
            "The code host could not be reached (codehost_unavailable), or the database is \
                busy (unavailable); try again later"
        }
        _ => "",
    };
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
        .into()
}

/// Declares sets of error answers for `responses(...)` of `#[utoipa::path]`, each listing
/// its statuses once for all the operations that can answer them.
macro_rules! error_sets {
    ($($(#[doc = $doc:literal])+ $name:ident: [$($status:literal),+];)+) => {$(
        $(#[doc = $doc])+
        pub struct $name;

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                [$($status),+]
                    .into_iter()
                    .map(|status: u16| (status.to_string(), error_response(status)))
                    .collect()
            }
        }
    )+};
}

error_sets! {
    /// 401: any authenticated operation without parameters.
    AuthErrors: [401];
    /// 401, 403: an admin's read without parameters.
    AdminReadErrors: [401, 403];
    /// 400, 401: a read with query parameters.
    QueryErrors: [400, 401];
    /// 400, 401, 404: a read of one resource.
    LookupErrors: [400, 401, 404];
    /// 400, 401, 403, 404: a change to one resource, for some roles only.
    ChangeErrors: [400, 401, 403, 404];
    /// 400, 401, 403, 404, 409: a state transition of one resource.
    TransitionErrors: [400, 401, 403, 404, 409];
    /// 400, 401, 403, 413: a JSON body, for some roles only.
    BodyErrors: [400, 401, 403, 413];
    /// 400, 401, 403, 404, 413: a JSON body about one resource, for some roles only.
    BodyChangeErrors: [400, 401, 403, 404, 413];
    /// 412: a call to the code host with the stored `CODEHOST_TOKEN`, and none is stored.
    TokenErrors: [412];
    /// 422, 503: a call to the code host, which refused or could not be reached.
    CodeHostErrors: [422, 503];
}

/// The answer of an idempotent creation: 201 with `body` when this call created it, else 200
/// with what was already there.
pub(crate) fn created_or_existing(created: bool, body: impl serde::Serialize) -> HttpResponse {
    if created {
        HttpResponse::Created().json(body)
    } else {
        HttpResponse::Ok().json(body)
    }
}

/// The answer for a route that does not exist.
pub(crate) async fn unknown_route(req: actix_web::HttpRequest) -> HttpResponse {
    ApiError::not_found(format!("no route {} {}", req.method(), req.path())).error_response()
}

#[cfg(test)]
mod tests {
    /// Every `{name}` of a documented path is one parameter `in: path` of that name, required,
    /// and no operation documents a path parameter its path lacks: a handler that names the
    /// wrong path type in `params(...)` is caught here.
    #[test]
    fn path_parameters_match_the_path_templates() {
        let doc = serde_json::to_value(crate::app::openapi()).expect("the document serialises");
        for (path, item) in doc["paths"].as_object().expect("paths") {
            let mut templated: Vec<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            templated.sort_unstable();
            for (method, op) in item.as_object().expect("path item") {
                let params = op["parameters"].as_array().map(Vec::as_slice);
                let in_path: Vec<&serde_json::Value> = params
                    .unwrap_or_default()
                    .iter()
                    .filter(|p| p["in"] == "path")
                    .collect();
                let mut names: Vec<&str> = in_path
                    .iter()
                    .map(|p| p["name"].as_str().expect("a parameter's name"))
                    .collect();
                names.sort_unstable();
                assert_eq!(names, templated, "{method} {path}");
                for p in in_path {
                    assert_eq!(p["required"], true, "{method} {path}: {p}");
                }
            }
        }
    }
}
