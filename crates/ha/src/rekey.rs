//! `stratum-server certs rekey`: the seed's `RekeySharedCerts`, under the node maintenance
//! lock and the cluster's maintenance fence.
//!
//! A fresh certificate-key seals the shared files as the legacy entry, and every per-token
//! grant entry goes in the same Secret update ([`crate::grants::rekey_shared_certs`]): no
//! earlier certificate-key opens anything afterwards, through its own entry or the legacy
//! one. The fence (`kube-system/stratum-maintenance`, [`crate::fence`]) is taken first and
//! rechecked (and renewed) immediately before each write attempt, inside the conflict
//! retry, so a rekey whose fence was lost while a call stalled refuses the write instead
//! of overwriting whatever its successor published.

use std::path::PathBuf;

use tracing::warn;

use crate::fence::{Fence, FenceError};
use crate::grants::{self, BoxError, CertKey, GrantError, Published, UploadProfile};
use crate::maintenance::{MaintenanceError, NodeLock};

/// What `certs rekey` was given.
#[derive(Debug, Clone)]
pub struct RekeyOptions {
    /// The PKI directory holding the shared files.
    pub pki_dir: PathBuf,
    /// This node's state directory (the maintenance lock).
    pub state_dir: PathBuf,
    /// The fence holder's identity (host name and pid by default).
    pub identity: String,
}

/// A rekey that did not publish.
#[derive(Debug, thiserror::Error)]
pub enum RekeyError {
    /// Another maintenance command runs on this node.
    #[error(transparent)]
    Lock(#[from] MaintenanceError),
    /// The fence is held by someone else, or could not be taken.
    #[error(transparent)]
    Fence(#[from] FenceError),
    /// The publication failed (a lost fence included: see its source).
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The key file exists before the rekey: it is never replaced.
    #[error("{} exists: the key file is never replaced; choose another name. Nothing was changed", path.display())]
    KeyFileExists {
        /// The file.
        path: PathBuf,
    },
    /// The key file appeared while the rekey ran: the new key is published, not saved.
    #[error("{} appeared during the rekey and was left alone; the new key is published but not saved: run the rekey again", path.display())]
    KeyFileAppeared {
        /// The file.
        path: PathBuf,
    },
    /// Writing the key file failed: the new key is published, not saved.
    #[error("cannot save the new key to {}: it is published but not saved; run the rekey again", path.display())]
    KeyFileWrite {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: common::fsutil::FsError,
    },
}

/// Refuses a key file that already exists (a symlink included), before anything changes.
pub fn key_file_free(path: &std::path::Path) -> Result<(), RekeyError> {
    if path.symlink_metadata().is_ok() {
        return Err(RekeyError::KeyFileExists {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Saves the new key to `path` (hex, mode 0600), never replacing a file.
pub fn save_key(path: &std::path::Path, key: &CertKey) -> Result<(), RekeyError> {
    let created =
        common::fsutil::write_atomic_new(path, format!("{}\n", key.to_hex()).as_bytes(), 0o600)
            .map_err(|source| RekeyError::KeyFileWrite {
                path: path.to_path_buf(),
                source,
            })?;
    if !created {
        return Err(RekeyError::KeyFileAppeared {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// What a rekey published.
#[derive(Debug)]
pub struct Rekeyed {
    /// The new certificate-key: the only key that opens the shared files now.
    pub key: CertKey,
    /// The write.
    pub published: Published,
}

/// Rekeys the shared certs; see the module docs.
pub async fn rekey_certs(
    client: &kube::Client,
    opts: &RekeyOptions,
    mut progress: impl FnMut(&str),
) -> Result<Rekeyed, RekeyError> {
    let _lock = NodeLock::acquire(&opts.state_dir, "certs rekey")?;
    let fence = Fence::take(client, &opts.identity).await?;
    progress(&format!(
        "holding the maintenance fence {}/{} as {}",
        crate::fence::FENCE_NAMESPACE,
        crate::fence::FENCE_LEASE,
        fence.identity()
    ));
    let key = CertKey::generate();
    let result = grants::rekey_shared_certs(
        client,
        &opts.pki_dir,
        &key,
        &UploadProfile::default(),
        || {
            let fence = fence.clone();
            async move { fence.confirm().await.map_err(|e| Box::new(e) as BoxError) }
        },
    )
    .await;
    if let Err(e) = fence.release().await {
        warn!(
            "cannot release the maintenance fence (it runs out by itself): {}",
            crate::error_chain(&e)
        );
    }
    let published = result?;
    progress(&format!(
        "published generation {} under the new key; {} grant entr{} retired",
        published.generation,
        published.dropped.len(),
        if published.dropped.len() == 1 {
            "y"
        } else {
            "ies"
        }
    ));
    Ok(Rekeyed { key, published })
}
