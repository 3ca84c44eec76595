//! The wire contract (`allot_api`, what the plugin sends and reads) in core's terms and back.

use allot_api as api;
use allot_core::store::Attachment;
use allot_engine::AddOutcome;

/// The attachment a request names.
pub fn attachment(a: &api::AttachmentId) -> Attachment {
    Attachment {
        container_id: a.container_id.clone(),
        interface: a.if_name.clone(),
    }
}

pub fn attachment_id(a: &Attachment) -> api::AttachmentId {
    api::AttachmentId {
        container_id: a.container_id.clone(),
        if_name: a.interface.clone(),
    }
}

/// What an ADD (or CHECK) holds, as the plugin renders it: addresses with their gateways and
/// pools, and the routes.
pub fn result(o: &AddOutcome) -> api::IpamResult {
    api::IpamResult {
        ips: o
            .allocations
            .iter()
            .map(|a| api::IpConfig {
                address: a.cidr(),
                gateway: a.gateway.map(|g| g.to_string()),
                pool: a.pool.clone(),
            })
            .collect(),
        routes: o
            .routes
            .iter()
            .map(|r| api::RouteConfig {
                dst: r.dst.to_string(),
                gw: Some(r.gw.to_string()),
            })
            .collect(),
        probe: None,
        preprobed: None,
        guest_addresses: Vec::new(),
    }
}
