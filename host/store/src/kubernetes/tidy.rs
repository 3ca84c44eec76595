//! Emptied blocks: an IPBlock keeps its `released` times after its last claim goes, for the
//! cool-down; once those have passed it holds nothing anyone reads, and is deleted.
//!
//! Each delete carries the resourceVersion the block was seen empty at, so a claim written
//! meanwhile wins: the API server refuses the delete (409) and the block stays. A writer that
//! computed a claim on the block's last version and loses to the delete gets 404, reads again,
//! finds nothing and creates the block anew (see `change_block`). Either way no claim is lost.

use kube::api::{DeleteParams, Preconditions};

use super::{Backend, attempt};
use allot_core::store::StoreError;

impl Backend {
    /// Deletes up to `limit` blocks that hold no claim and whose releases all happened before
    /// `cooled_before` (unix seconds). Returns how many it deleted.
    pub(super) async fn delete_emptied(
        &self,
        cooled_before: u64,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let mut deleted = 0;
        for (name, version) in self.mirror.emptied(cooled_before, limit) {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(version.clone()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            self.count();
            let what = format!("deleting the emptied IPBlock {name}");
            match attempt(&what, self.api.delete(&name, &params)).await? {
                Ok(_) => {
                    // Out of the mirror now, so that the next call moves on to other blocks.
                    self.mirror.forget_deleted(&name, &version);
                    deleted += 1;
                }
                // Written since it was seen empty (409), or already gone (404): nothing to do.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    let message = format!(
                        "{what}: {}. The controller's ServiceAccount needs delete on \
                         ipblocks.allot.dev (the Helm chart's ClusterRole grants it)",
                        s.message
                    );
                    return Err(StoreError::backend_caused(message, kube::Error::Api(s)));
                }
                Err(e) => return Err(super::api_error(&what, e)),
            }
        }
        Ok(deleted)
    }
}
