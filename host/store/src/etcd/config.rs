//! Pools, subnets and reserved addresses kept in etcd, for agents without a shared directory:
//! `PREFIX/config/KIND/NAME` holds one object as JSON (`apiVersion`, `kind`, `metadata`,
//! `spec`), written by `allotctl pool apply` and read by every agent started with
//! `--store etcd://…` and no `--standalone` directory.

use allot_core::config::Observation;
use allot_core::documents;
use allot_core::store::StoreError;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::EtcdStore;
use super::keys::Keys;

/// One configuration key as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEntry {
    pub key: String,
    pub kind: String,
    pub name: String,
    pub value: String,
    /// Guards a later write: the entry is replaced only if nobody changed it since.
    pub mod_revision: i64,
}

/// A write of [`EtcdStore::apply_config`]: `value` for `KIND/NAME`, expected at `mod_revision`
/// (0: expected absent).
#[derive(Clone, Debug)]
pub struct ConfigWrite {
    pub kind: String,
    pub name: String,
    pub value: String,
    pub expected_revision: i64,
}

impl Keys {
    pub fn config(&self) -> String {
        format!("{}/config/", self.prefix())
    }

    pub fn config_object(&self, kind: &str, name: &str) -> String {
        format!(
            "{}/config/{}/{}",
            self.prefix(),
            super::keys::segment(kind),
            super::keys::segment(name)
        )
    }
}

impl EtcdStore {
    /// Every configuration key, at one revision; returns it too.
    pub fn config_entries(&self) -> Result<(i64, Vec<ConfigEntry>), StoreError> {
        let prefix = self.keys().config();
        self.run(move |s| async move {
            let (revision, kvs) = s.list(&prefix, None).await?;
            let entries = kvs
                .iter()
                .filter_map(|kv| {
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    let rest = key.strip_prefix(&prefix)?.to_string();
                    let (kind, _) = rest.split_once('/')?;
                    Some(ConfigEntry {
                        kind: kind.to_string(),
                        name: Keys::name_of(kv.key())?,
                        value: String::from_utf8_lossy(kv.value()).into_owned(),
                        mod_revision: kv.mod_revision(),
                        key,
                    })
                })
                .collect();
            Ok((revision, entries))
        })
    }

    /// The configuration as the standalone loader would observe it: each key a source, checked
    /// with the same validation. Returns a fingerprint that changes with any key.
    pub fn load_config(&self) -> Result<(u64, Observation), StoreError> {
        let (_, entries) = self.config_entries()?;
        let mut observation = Observation::default();
        let mut fingerprint: u64 = 0xcbf2_9ce4_8422_2325;
        for e in &entries {
            documents::observe_text(&e.value, &e.key, &mut observation);
            for byte in e.key.bytes().chain(e.mod_revision.to_le_bytes()) {
                fingerprint = (fingerprint ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
            }
        }
        Ok((fingerprint, observation))
    }

    /// Writes every object in one transaction, each guarded on the revision it was read at: a
    /// concurrent edit makes the whole apply fail, writing nothing.
    pub fn apply_config(&self, writes: Vec<ConfigWrite>) -> Result<(), StoreError> {
        let keys = self.keys().clone();
        self.run(move |s| async move {
            let mut compares = Vec::new();
            let mut puts = Vec::new();
            for w in &writes {
                let key = keys.config_object(&w.kind, &w.name);
                compares.push(if w.expected_revision == 0 {
                    Compare::create_revision(key.clone(), CompareOp::Equal, 0)
                } else {
                    Compare::mod_revision(key.clone(), CompareOp::Equal, w.expected_revision)
                });
                puts.push(TxnOp::put(key, w.value.clone(), None));
            }
            let resp = s
                .kv()
                .txn(Txn::new().when(compares).and_then(puts))
                .await
                .map_err(|e| s.err(e))?;
            if resp.succeeded() {
                Ok(())
            } else {
                Err(StoreError::unavailable(
                    "another apply changed these objects meanwhile; nothing was written: run \
                     the apply again",
                ))
            }
        })
    }
}
