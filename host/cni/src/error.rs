//! The CNI error object: `{"cniVersion","code","msg","details"}` on stdout, exit status 1.
//!
//! Every failure in the plugin is a [`CniError`] value; nothing panics on bad input. The one
//! exception is the last-resort panic guard in `cmd`, which also ends up here.

use allot_api::{ErrorBody, codes};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Code 1: the caller's `cniVersion` (or the verb, for that version) is not supported.
    pub fn incompatible_version(msg: impl Into<String>) -> Self {
        Self::new(codes::INCOMPATIBLE_VERSION, msg)
    }

    /// Code 4: a `CNI_*` variable is missing or malformed; the message names it.
    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Self::new(codes::INVALID_ENVIRONMENT, msg)
    }

    /// Code 5: reading stdin failed, or the agent spoke something that is not the API.
    pub fn io(msg: impl Into<String>) -> Self {
        Self::new(codes::IO_FAILURE, msg)
    }

    /// Code 6: stdin is not a JSON object.
    pub fn decode(msg: impl Into<String>) -> Self {
        Self::new(codes::DECODE_FAILURE, msg)
    }

    /// Code 7: the network config is JSON but a field is missing, mistyped or unknown.
    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(codes::INVALID_NETWORK_CONFIG, msg)
    }

    /// Code 11: the agent is unreachable or slow; the runtime should retry.
    pub fn try_again(msg: impl Into<String>) -> Self {
        Self::new(codes::TRY_AGAIN_LATER, msg)
    }

    /// The error object, as printed on stdout. `details` is left out when empty (the spec marks
    /// it optional, and the reference Go types omit it the same way).
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        let out = Out {
            cni_version,
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        };
        // Serialising a struct of strings and a number cannot fail; keep a hand-written
        // fallback anyway so that this path can never panic.
        serde_json::to_string(&out).unwrap_or_else(|_| {
            format!(
                "{{\"cniVersion\":\"1.1.0\",\"code\":{},\"msg\":\"allot failed\"}}",
                self.code
            )
        })
    }
}

impl From<ErrorBody> for CniError {
    fn from(body: ErrorBody) -> Self {
        // Code 0 would read as success to some callers; an agent should never send it.
        let code = if body.code == 0 {
            codes::IO_FAILURE
        } else {
            body.code
        };
        CniError {
            code,
            msg: body.msg,
            details: body.details,
        }
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_object_has_the_spec_shape() {
        let e = CniError::invalid_config("bad").with_details("more");
        let v: serde_json::Value = serde_json::from_str(&e.to_json("0.4.0")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"0.4.0","code":7,"msg":"bad","details":"more"})
        );
    }

    #[test]
    fn empty_details_are_omitted() {
        let json = CniError::try_again("later").to_json("1.1.0");
        assert_eq!(json, r#"{"cniVersion":"1.1.0","code":11,"msg":"later"}"#);
    }

    #[test]
    fn messages_are_escaped() {
        let json = CniError::decode("a \"quoted\"\nline").to_json("1.0.0");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["msg"], "a \"quoted\"\nline");
    }

    #[test]
    fn agent_error_bodies_pass_through() {
        let e: CniError = ErrorBody {
            code: 100,
            msg: "no pool fits".into(),
            details: "p1: exhausted".into(),
        }
        .into();
        assert_eq!(
            e,
            CniError::new(100, "no pool fits").with_details("p1: exhausted")
        );
        let zero: CniError = ErrorBody {
            code: 0,
            msg: "x".into(),
            details: String::new(),
        }
        .into();
        assert_eq!(zero.code, codes::IO_FAILURE);
    }
}
