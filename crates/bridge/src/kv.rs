//! The controller's store across machines: a NATS JetStream key-value
//! bucket behind [`fairfeed_net::tree::store::KvStore`] (async-nats's `kv`,
//! driven from a runtime of its own so the keeper's thread can block on it).
//! On a 3-node NATS cluster the bucket keeps 3 replicas, so the membership
//! outlives any one broker and any one controller.

use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use fairfeed_net::tree::store::{Entry, KvStore, StoreError};

use crate::security::Security;

/// A store call that takes longer than this fails (the keeper retries on its next tick).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A JetStream KV bucket.
pub struct JetStreamKv {
    rt: tokio::runtime::Runtime,
    bucket: kv::Store,
    url: String,
    name: String,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

impl JetStreamKv {
    /// Connects to `url` (one or more `nats://` addresses, comma-separated)
    /// and opens bucket `name`, creating it with `replicas` copies if missing.
    pub fn open(url: &str, security: &Security, name: &str, replicas: usize) -> Result<Self, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(unavailable)?;
        let servers = crate::security::servers(url).map_err(unavailable)?;
        let bucket = rt.block_on(async {
            let opts = security.apply(async_nats::ConnectOptions::new()).await.map_err(unavailable)?;
            let client = tokio::time::timeout(CALL_TIMEOUT * 5, opts.connect(servers))
                .await
                .map_err(|_| unavailable(format!("no NATS server answered at {url}")))?
                .map_err(unavailable)?;
            let js = async_nats::jetstream::new(client);
            if let Ok(b) = js.get_key_value(name).await {
                return Ok(b);
            }
            // The bucket's stream, made as async-nats's create_key_value makes
            // it — but without its account query, which servers before 2.10
            // (Debian's 2.9) answer in a shape the client cannot read.
            let cfg = async_nats::jetstream::stream::Config {
                name: format!("KV_{name}"),
                description: Some("fairfeed tree membership (fairfeed controller)".into()),
                subjects: vec![format!("$KV.{name}.>")],
                max_messages_per_subject: 1,
                allow_rollup: true,
                deny_delete: true,
                allow_direct: true,
                num_replicas: replicas,
                discard: async_nats::jetstream::stream::DiscardPolicy::New,
                ..Default::default()
            };
            js.get_or_create_stream(cfg).await.map_err(|e| unavailable(format!("creating bucket {name}: {e}")))?;
            js.get_key_value(name).await.map_err(|e| unavailable(format!("opening bucket {name}: {e}")))
        })?;
        Ok(JetStreamKv { rt, bucket, url: url.to_string(), name: name.to_string() })
    }

    fn call<T, E: std::fmt::Display>(
        &self,
        f: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<Result<T, E>, StoreError> {
        self.rt.block_on(async { tokio::time::timeout(CALL_TIMEOUT, f).await.map_err(|_| unavailable("timed out")) })
    }
}

impl KvStore for JetStreamKv {
    fn entry(&mut self, key: &str) -> Result<Option<Entry>, StoreError> {
        let e = self.call(self.bucket.entry(key))?.map_err(unavailable)?;
        Ok(e.filter(|e| e.operation == Operation::Put).map(|e| Entry { value: e.value.to_vec(), revision: e.revision }))
    }

    fn put(&mut self, key: &str, value: &[u8]) -> Result<u64, StoreError> {
        self.call(self.bucket.put(key, value.to_vec().into()))?.map_err(unavailable)
    }

    fn create(&mut self, key: &str, value: &[u8]) -> Result<u64, StoreError> {
        match self.call(self.bucket.create(key, value.to_vec().into()))? {
            Ok(r) => Ok(r),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Err(StoreError::Conflict),
            Err(e) => Err(unavailable(e)),
        }
    }

    fn update(&mut self, key: &str, value: &[u8], revision: u64) -> Result<u64, StoreError> {
        match self.call(self.bucket.update(key, value.to_vec().into(), revision))? {
            Ok(r) => Ok(r),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Err(StoreError::Conflict),
            Err(e) => Err(unavailable(e)),
        }
    }

    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.call(self.bucket.delete(key))?.map_err(unavailable)
    }

    fn keys(&mut self) -> Result<Vec<String>, StoreError> {
        use futures::TryStreamExt;
        self.call(async {
            let keys = self.bucket.keys().await.map_err(|e| e.to_string())?;
            keys.try_collect::<Vec<String>>().await.map_err(|e| e.to_string())
        })?
        .map_err(unavailable)
    }

    fn describe(&self) -> String {
        format!("JetStream bucket {} at {}", self.name, self.url)
    }
}
