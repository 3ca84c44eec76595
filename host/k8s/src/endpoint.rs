//! Endpoint: what one pod holds, named after the pod, in its namespace (the by-pod index of the
//! Kubernetes store, and what `kubectl get endpoints.allot.dev` shows a user).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(
    CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema,
)]
#[kube(
    group = "allot.dev",
    version = "v1alpha1",
    kind = "Endpoint",
    plural = "endpoints",
    doc = "The addresses one pod holds, per interface; named after the pod.",
    namespaced,
    printcolumn = r#"{"name":"NODE","type":"string","jsonPath":".spec.node"}"#,
    printcolumn = r#"{"name":"IPV4","type":"string","jsonPath":".spec.interfaces[0].ipv4"}"#,
    printcolumn = r#"{"name":"IPV6","type":"string","jsonPath":".spec.interfaces[0].ipv6"}"#,
    printcolumn = r#"{"name":"OWNER","type":"string","jsonPath":".spec.owner.name"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSpec {
    /// The pod's UID: a pod recreated with the same name has another one.
    pub uid: String,
    pub node: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<EndpointInterface>,
    /// The pod's top-level controller, resolved through ReplicaSets and Jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerRef>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointInterface {
    pub ifname: String,
    /// The address with its prefix length (`10.0.0.7/24`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<String>,
    /// The pools the addresses came from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<allot_core::spec::RouteSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OwnerRef {
    pub kind: String,
    pub name: String,
}
