//! weft's own resources (`weft.v1`), generated from `proto/weft/v1/*.proto`. Each maps 1:1 onto
//! a type of weft-proxy's YAML config, so the control plane can push exactly what a file can
//! say. They travel inside `google.protobuf.Any`; [`to_any`] and [`from_any`] pack and unpack
//! them, checking the type URL so a resource of one kind is never decoded as another.

use std::fmt;

use prost::Message;

use crate::transport::Any;
use crate::typeurl;

/// The generated `weft.v1` messages.
#[allow(clippy::doc_lazy_continuation, clippy::derive_partial_eq_without_eq)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/weft.v1.rs"));
}

/// A weft resource: a message with a fixed type URL and a name that keys it within its type.
pub trait Resource: Message + Default + Sized {
    /// The type URL of this message (one of [`typeurl::ALL`]).
    const TYPE_URL: &'static str;
    /// The name the resource is subscribed to and cached under.
    fn resource_name(&self) -> &str;
}

macro_rules! resource {
    ($($ty:ident => $url:path, |$r:ident| $name:expr;)*) => {
        $(impl Resource for v1::$ty {
            const TYPE_URL: &'static str = $url;
            fn resource_name(&self) -> &str {
                let $r = self;
                $name
            }
        })*
    };
}

resource! {
    Listener => typeurl::LISTENER, |r| &r.name;
    Service => typeurl::SERVICE, |r| &r.name;
    AuthorizationPolicy => typeurl::AUTHORIZATION_POLICY, |r| &r.name;
    Revocation => typeurl::REVOCATION, |r| &r.name;
    Experiment => typeurl::EXPERIMENT, |r| &r.name;
    Cluster => typeurl::CLUSTER, |r| &r.name;
    Endpoints => typeurl::ENDPOINTS, |r| &r.cluster_name;
    ShardMap => typeurl::SHARD_MAP, |r| &r.name;
    ScalingDecision => typeurl::SCALING_DECISION, |r| &r.name;
    Placement => typeurl::PLACEMENT, |r| &r.name;
}

/// Packs a resource into an `Any` under its type URL. Maps are ordered (see `build.rs`), so
/// the same resource always encodes to the same bytes and the cache can compare bodies.
pub fn to_any<R: Resource>(resource: &R) -> Any {
    Any { type_url: R::TYPE_URL.to_owned(), value: resource.encode_to_vec() }
}

/// Why an `Any` could not be unpacked as the expected resource.
#[derive(Debug, Clone, PartialEq)]
pub enum UnpackError {
    /// The `Any` holds another kind of message.
    WrongType { expected: &'static str, found: String },
    /// The bytes are not a valid encoding of the message.
    Decode(prost::DecodeError),
}

impl fmt::Display for UnpackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnpackError::WrongType { expected, found } => {
                write!(f, "expected a resource of type {expected}, found {found:?}")
            }
            UnpackError::Decode(e) => write!(f, "undecodable resource: {e}"),
        }
    }
}

impl std::error::Error for UnpackError {}

/// Unpacks an `Any` as resource `R`, refusing any other type URL.
pub fn from_any<R: Resource>(any: &Any) -> Result<R, UnpackError> {
    if any.type_url != R::TYPE_URL {
        return Err(UnpackError::WrongType { expected: R::TYPE_URL, found: any.type_url.clone() });
    }
    R::decode(any.value.as_slice()).map_err(UnpackError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Name;

    fn assert_url<R: Resource + Name>() {
        assert_eq!(R::TYPE_URL, R::type_url(), "constant and generated type URL disagree");
        assert!(typeurl::ALL.contains(&R::TYPE_URL));
    }

    #[test]
    fn type_url_constants_match_the_generated_message_names() {
        assert_url::<v1::Listener>();
        assert_url::<v1::Service>();
        assert_url::<v1::Experiment>();
        assert_url::<v1::Cluster>();
        assert_url::<v1::Endpoints>();
        assert_url::<v1::ShardMap>();
        assert_url::<v1::ScalingDecision>();
        assert_url::<v1::Placement>();
        assert_url::<v1::AuthorizationPolicy>();
        assert_url::<v1::Revocation>();
        assert_eq!(typeurl::ALL.len(), 10);
    }

    #[test]
    fn any_round_trips_a_service_with_routes_and_durations() {
        let service = v1::Service {
            name: "chat".into(),
            hosts: vec!["chat.svc".into()],
            routes: vec![v1::Route {
                name: "default".into(),
                r#match: Some(v1::RouteMatch {
                    path_prefix: Some("/v1/".into()),
                    headers: vec![v1::HeaderMatch { name: "x-tenant".into(), exact: None }],
                    ..Default::default()
                }),
                target: Some(v1::route::Target::Experiment("chat-ab".into())),
                timeout: Some(prost_types::Duration { seconds: 30, nanos: 0 }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let any = to_any(&service);
        assert_eq!(any.type_url, "type.googleapis.com/weft.v1.Service");
        assert_eq!(from_any::<v1::Service>(&any), Ok(service));
    }

    #[test]
    fn from_any_refuses_another_type() {
        let any = to_any(&v1::Cluster { name: "a".into(), ..Default::default() });
        let err = from_any::<v1::Listener>(&any).unwrap_err();
        assert!(matches!(err, UnpackError::WrongType { expected, .. } if expected == typeurl::LISTENER));
    }

    #[test]
    fn from_any_reports_undecodable_bytes() {
        let any = Any { type_url: typeurl::CLUSTER.into(), value: vec![0xff, 0xff, 0xff] };
        assert!(matches!(from_any::<v1::Cluster>(&any), Err(UnpackError::Decode(_))));
    }

    #[test]
    fn maps_encode_in_key_order_whatever_the_insertion_order() {
        let endpoint = |keys: Vec<u32>| {
            let mut ep = v1::Endpoint { address: "127.0.0.1:1".into(), ..Default::default() };
            for i in keys {
                ep.labels.insert(format!("k{i}"), format!("v{i}"));
            }
            v1::Endpoints { cluster_name: "c".into(), endpoints: vec![ep] }
        };
        let up = endpoint((0..32).collect());
        let down = endpoint((0..32).rev().collect());
        assert_eq!(to_any(&up).value, to_any(&down).value);
    }
}
