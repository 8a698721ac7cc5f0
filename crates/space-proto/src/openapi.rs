//! OpenAPI schemas of the identity types the HTTP bodies carry (`space-identity` has
//! no OpenAPI dependency, so their schemas are written here, from their text forms),
//! for the fields of [`crate::api`]'s types: `#[schema(value_type = …)]` names one of
//! these in place of the identity type. Behind the `openapi` feature.
//!
//! Each schema is a component of its own (`SandboxId`, `Access`, …), so a document
//! names it once and refers to it everywhere.
//!
//! Also here, what both documents share: the sandbox path parameter, the error
//! answers ([`error_responses`], [`crate::error_responses!`]), raw bytes, and the
//! `{"status"}` body of `/healthz` and `/readyz`.

use std::borrow::Cow;
use std::collections::BTreeMap;

use space_identity::{Access, ExecutionId, Protocol, Purpose, SandboxId, Substrate};
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, schema::SchemaFormat};
use utoipa::{IntoParams, PartialSchema, ToSchema};

/// The `{id}` of every sandbox-scoped path.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SandboxPath {
    /// The sandbox's ID; one that does not parse is 404 at the edge and 403 `deny`
    /// (`sandbox_mismatch`) at a worker.
    #[param(value_type = SandboxIdSchema)]
    pub id: String,
}

/// `{"status": "ok"}` (`/healthz`) or `{"status": "ready"}` (`/readyz`).
#[derive(Debug, ToSchema)]
pub struct Status {
    /// `ok` or `ready`.
    pub status: String,
}

/// The error answers `list` names, each `{"error", "message"[, "reason"]}`
/// ([`crate::api::ErrorBody`]) with its description: `(status, description)`.
pub fn error_responses(list: &[(u16, &str)]) -> BTreeMap<String, RefOr<Response>> {
    list.iter()
        .map(|(status, description)| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build();
            let response = ResponseBuilder::new()
                .description(*description)
                .content("application/json", body)
                .build();
            (status.to_string(), RefOr::T(response))
        })
        .collect()
}

/// Declares `$name`, an [`utoipa::IntoResponses`] of the error answers listed
/// (`(status, description)` pairs), for a handler's `responses(…)`.
#[macro_export]
macro_rules! error_responses {
    ($(#[$doc:meta])* $name:ident: [$($answer:expr),+ $(,)?]) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name;

        impl ::utoipa::IntoResponses for $name {
            fn responses() -> ::std::collections::BTreeMap<
                String,
                ::utoipa::openapi::RefOr<::utoipa::openapi::response::Response>,
            > {
                $crate::openapi::error_responses(&[$($answer),+])
            }
        }
    };
}

/// A string schema with a description, a pattern and an example.
fn text(description: &str, pattern: Option<&str>, example: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::String))
        .description(Some(description))
        .pattern(pattern)
        .examples([serde_json::Value::from(example)])
        .into()
}

/// A string schema that takes one of `values`.
fn one_of(description: &str, values: &[&str]) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::String))
        .description(Some(description))
        .enum_values(Some(values.iter().copied()))
        .into()
}

/// An identifier of 128 random bits in its text form: `prefix` and 26 base32 characters.
fn random_id(description: &str, prefix: &str, example: &str) -> RefOr<Schema> {
    text(
        description,
        Some(&format!("^{prefix}[a-z2-7]{{26}}$")),
        example,
    )
}

macro_rules! schema {
    ($(#[$doc:meta])* $marker:ident, $name:literal, $schema:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $marker;

        impl PartialSchema for $marker {
            fn schema() -> RefOr<Schema> {
                $schema
            }
        }

        impl ToSchema for $marker {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

schema!(
    /// Bytes as they are (a file's content, an archive).
    RawBytes,
    "RawBytes",
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::String))
        .description(Some("Bytes as they are."))
        .content_media_type("application/octet-stream")
        .into()
);

schema!(
    /// [`SandboxId`]: `sbx_` and 26 base32 characters.
    SandboxIdSchema,
    "SandboxId",
    random_id(
        "A sandbox's stable ID.",
        SandboxId::PREFIX,
        "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaa"
    )
);

schema!(
    /// [`ExecutionId`]: `exe_` and 26 base32 characters.
    ExecutionIdSchema,
    "ExecutionId",
    random_id(
        "The random ID of one execution of a sandbox.",
        ExecutionId::PREFIX,
        "exe_aaaaaaaaaaaaaaaaaaaaaaaaaa"
    )
);

schema!(
    /// [`space_identity::WorkerId`]: a DNS label.
    WorkerIdSchema,
    "WorkerId",
    text(
        "A worker's name: 1 to 63 characters of a-z, 0-9 and -, not starting with -.",
        Some("^[a-z0-9][a-z0-9-]{0,62}$"),
        "w1"
    )
);

schema!(
    /// [`space_identity::PodUid`]: a UUID.
    PodUidSchema,
    "PodUid",
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::String))
        .description(Some("A Kubernetes pod UID (Kubernetes substrate only)."))
        .format(Some(SchemaFormat::Custom("uuid".into())))
        .into()
);

schema!(
    /// [`Substrate`]'s text forms.
    SubstrateSchema,
    "Substrate",
    one_of(
        "The isolation technology that runs an execution.",
        &substrates()
    )
);

schema!(
    /// [`Access`]'s text forms.
    AccessSchema,
    "Access",
    one_of(
        "One kind of access a capability grants.",
        &Access::ALL.map(Access::as_str)
    )
);

schema!(
    /// [`crate::api::Policy`]: a sandbox's network policy.
    NetworkSchema,
    "Network",
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .description(Some(
            "A sandbox's network policy. Mode `none`: loopback only. Mode `egress`: \
             outbound connections and DNS, judged by `deny` (always first), then \
             `allow` (empty: everything not denied) and the operator's global deny \
             list. A rule is a name (`pypi.org`), a wildcard (`*.example.com`: names \
             strictly below it) or an address or network (`203.0.113.0/24`); at most \
             256 per list.",
        ))
        .property("mode", one_of("Network mode.", &["none", "egress"]))
        .required("mode")
        .property("allow", rules("Rules that allow."))
        .property("deny", rules("Rules that refuse; they beat `allow`."))
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .into()
);

fn rules(description: &str) -> ArrayBuilder {
    ArrayBuilder::new()
        .description(Some(description))
        .items(ObjectBuilder::new().schema_type(SchemaType::Type(Type::String)))
        .max_items(Some(256))
}

schema!(
    /// [`Purpose`]'s text forms.
    PurposeSchema,
    "Purpose",
    one_of(
        "Which kind of receiver accepts a capability.",
        &purposes()
    )
);

schema!(
    /// [`Protocol`]'s text forms.
    ProtocolSchema,
    "Protocol",
    one_of("A service port's protocol.", &protocols())
);

// Each list below is every variant: the `match` stops compiling when one is added.

fn substrates() -> [&'static str; 4] {
    let all = [
        Substrate::Jail,
        Substrate::Firecracker,
        Substrate::Kubernetes,
        Substrate::Vm,
    ];
    for s in all {
        match s {
            Substrate::Jail | Substrate::Firecracker | Substrate::Kubernetes | Substrate::Vm => {}
        }
    }
    all.map(Substrate::as_str)
}

fn purposes() -> [&'static str; 2] {
    let all = [Purpose::Control, Purpose::ServicePort];
    for p in all {
        match p {
            Purpose::Control | Purpose::ServicePort => {}
        }
    }
    all.map(Purpose::as_str)
}

fn protocols() -> [&'static str; 2] {
    let all = [Protocol::Http, Protocol::Tcp];
    for p in all {
        match p {
            Protocol::Http | Protocol::Tcp => {}
        }
    }
    all.map(Protocol::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(s: RefOr<Schema>) -> Vec<String> {
        let RefOr::T(Schema::Object(o)) = s else {
            panic!("not an object schema");
        };
        o.enum_values
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn every_listed_text_form_parses_as_its_identity_type() {
        for v in values(SubstrateSchema::schema()) {
            assert!(v.parse::<Substrate>().is_ok(), "{v}");
        }
        for v in values(AccessSchema::schema()) {
            assert!(v.parse::<Access>().is_ok(), "{v}");
        }
        for v in values(PurposeSchema::schema()) {
            assert!(v.parse::<Purpose>().is_ok(), "{v}");
        }
        for v in values(ProtocolSchema::schema()) {
            assert!(v.parse::<Protocol>().is_ok(), "{v}");
        }
        assert_eq!(values(AccessSchema::schema()).len(), Access::ALL.len());
    }

    #[test]
    fn the_id_examples_parse_and_match_their_patterns() {
        let example = |s: RefOr<Schema>| {
            let RefOr::T(Schema::Object(o)) = s else {
                panic!("not an object schema");
            };
            let text = o.examples[0].as_str().unwrap().to_owned();
            (text, o.pattern.unwrap())
        };
        let (sbx, pattern) = example(SandboxIdSchema::schema());
        assert!(sbx.parse::<SandboxId>().is_ok(), "{sbx}");
        assert_eq!(pattern, "^sbx_[a-z2-7]{26}$");
        let (exe, _) = example(ExecutionIdSchema::schema());
        assert!(exe.parse::<ExecutionId>().is_ok(), "{exe}");
        let (w, _) = example(WorkerIdSchema::schema());
        assert!(w.parse::<space_identity::WorkerId>().is_ok(), "{w}");
    }
}
