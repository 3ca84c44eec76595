//! Policy: which policy component a cluster runs, within which limits, and (in its status) which
//! one is serving and why a new one was refused.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "allot.dev",
    version = "v1alpha1",
    kind = "Policy",
    plural = "policies",
    doc = "The pool-selection policy component this cluster runs, and its limits.",
    status = "PolicyStatus",
    printcolumn = r#"{"name":"ON-FAILURE","type":"string","jsonPath":".spec.onFailure"}"#,
    printcolumn = r#"{"name":"SERVING","type":"string","jsonPath":".status.servingDigest"}"#,
    printcolumn = r#"{"name":"REFUSED","type":"string","jsonPath":".status.refusedReason"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    pub source: PolicySource,
    /// The component's digest (`sha256:` and 64 hex digits); a component with another digest is
    /// refused and the serving one stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub sha256: Option<String>,
    /// What an allocation does when the policy fails: `fail` it, or `fallback` to the embedded
    /// default policy.
    #[serde(default)]
    pub on_failure: OnFailure,
    /// Wall-clock limit of one decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub deadline_ms: Option<u32>,
    /// Linear memory limit of the component.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "memoryMiB")]
    #[schemars(range(min = 1, max = 4096))]
    pub memory_mib: Option<u32>,
}

/// Where the component comes from: exactly one of the three (a struct of options rather than
/// an enum, because a CRD's structural schema cannot express a tagged union; the API server
/// checks "exactly one" with the CEL rule below, [`PolicySource::location`] checks it again).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.configMap), has(self.oci), has(self.file)].filter(x, x).size() == 1",
    "message": "set exactly one of configMap, oci and file"
}]))]
pub struct PolicySource {
    /// A key of a ConfigMap (its binaryData) in the given namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKey>,
    /// An OCI artifact (`oci://HOST/REPO:TAG` or `oci://HOST/REPO@sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^oci://.+"))]
    pub oci: Option<String>,
    /// A file present on every node (an absolute path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^/.+"))]
    pub file: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ConfigMapKey {
    pub namespace: String,
    pub name: String,
    pub key: String,
}

/// A [`PolicySource`] with exactly one location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyLocation<'a> {
    ConfigMap(&'a ConfigMapKey),
    Oci(&'a str),
    File(&'a str),
}

/// Why a [`PolicySource`] has no one location: it sets `count` of them, not one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocationError {
    pub count: usize,
}

impl std::fmt::Display for LocationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a Policy source needs exactly one of configMap, oci and file; this one has {}",
            self.count
        )
    }
}

impl std::error::Error for LocationError {}

impl PolicySource {
    /// The one location set, or why there is not exactly one.
    pub fn location(&self) -> Result<PolicyLocation<'_>, LocationError> {
        let set: Vec<PolicyLocation<'_>> = [
            self.config_map.as_ref().map(PolicyLocation::ConfigMap),
            self.oci.as_deref().map(PolicyLocation::Oci),
            self.file.as_deref().map(PolicyLocation::File),
        ]
        .into_iter()
        .flatten()
        .collect();
        match <[PolicyLocation<'_>; 1]>::try_from(set) {
            Ok([one]) => Ok(one),
            Err(set) => Err(LocationError { count: set.len() }),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    #[default]
    Fail,
    Fallback,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// The digest of the component deciding now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_digest: Option<String>,
    /// The digest of the last component refused, and why (the serving one stayed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_reason: Option<String>,
}
