//! A node's tree keys at run time: the keyring in force ([`KeyCell`]) and
//! the thread that re-reads the key file ([`KeyFileWatch`]) — when its
//! contents change (looked at every [`KEY_POLL`]), on SIGHUP, or when the
//! operator sends a sealed `reload-keys` to the control socket.
//!
//! The node agent looks at the cell's generation once a turn (one atomic
//! load) and hands a new keyring to its state machine
//! ([`fairfeed_tree::node::Node::set_keys`]). A file that does not parse
//! changes nothing: the error is logged and counted, and the keys in force
//! stay. The rollover itself — accept the next key, seal with it, retire
//! the old — is the operator's three edits of the file (docs/SECURITY.md).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fairfeed_tree::auth::Auth;

/// How often the watch reads the key file.
pub const KEY_POLL: Duration = Duration::from_millis(200);
/// How often it looks for a reload request between reads.
const REQUEST_POLL: Duration = Duration::from_millis(20);
/// A key file larger than this is refused (a keyring is a few lines).
pub const KEY_FILE_MAX_BYTES: u64 = 64 << 10;

/// What the watch did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KeyStats {
    /// The id sealed with, and every id accepted.
    pub send_id: u8,
    pub ids: Vec<u8>,
    /// Keyrings put in force after the first.
    pub reloads: u64,
    /// Reads or parses that failed (the keys in force stayed).
    pub reload_errors: u64,
    pub last_error: Option<String>,
}

/// The keyring in force, shared by the watch and the node agent.
#[derive(Debug)]
pub struct KeyCell {
    generation: AtomicU64,
    keys: Mutex<Auth>,
    reload: Arc<AtomicBool>,
    stats: Mutex<KeyStats>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KeyCell {
    pub fn new(keys: &Auth) -> Arc<Self> {
        let stats = KeyStats { send_id: keys.send_id(), ids: keys.ids(), ..KeyStats::default() };
        Arc::new(KeyCell {
            generation: AtomicU64::new(0),
            keys: Mutex::new(keys.clone()),
            reload: Arc::new(AtomicBool::new(false)),
            stats: Mutex::new(stats),
        })
    }

    /// Raised each time another keyring is put in force.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The keyring in force.
    pub fn keys(&self) -> Auth {
        lock(&self.keys).clone()
    }

    /// Asks the watch to read the file now.
    pub fn ask_reload(&self) {
        self.reload.store(true, Ordering::Relaxed);
    }

    pub fn stats(&self) -> KeyStats {
        lock(&self.stats).clone()
    }

    /// Puts `keys` in force if they differ from the keys in force.
    fn put(&self, keys: Auth) -> bool {
        let mut k = lock(&self.keys);
        let mut next = k.clone();
        next.replace_keys(&keys);
        if next == *k {
            return false;
        }
        *k = next;
        let mut s = lock(&self.stats);
        (s.send_id, s.ids, s.reloads) = (keys.send_id(), keys.ids(), s.reloads + 1);
        self.generation.fetch_add(1, Ordering::Release);
        true
    }

    fn failed(&self, e: String) {
        let mut s = lock(&self.stats);
        s.reload_errors += 1;
        s.last_error = Some(e);
    }
}

/// The thread that keeps a [`KeyCell`] in step with its key file.
#[derive(Debug)]
pub struct KeyFileWatch {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Why a key file was not read.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0}: {1} bytes, more than a key file holds")]
    TooLarge(PathBuf, u64),
    #[error("{0}: {1}")]
    Keys(PathBuf, fairfeed_tree::auth::KeyError),
}

/// The keyring in `path` (bounded in size; errors name the file).
pub fn read_keys(path: &std::path::Path) -> Result<Auth, KeyFileError> {
    let at = || path.to_path_buf();
    let len = std::fs::metadata(path).map_err(|e| KeyFileError::Io(at(), e))?.len();
    if len > KEY_FILE_MAX_BYTES {
        return Err(KeyFileError::TooLarge(at(), len));
    }
    let text = std::fs::read_to_string(path).map_err(|e| KeyFileError::Io(at(), e))?;
    Auth::from_text(&text).map_err(|e| KeyFileError::Keys(at(), e))
}

impl KeyFileWatch {
    /// Watches `path` for `cell` (and SIGHUP, from now on, asks for a read).
    pub fn start(path: PathBuf, cell: Arc<KeyCell>) -> std::io::Result<Self> {
        signal_hook::flag::register(signal_hook::consts::SIGHUP, cell.reload.clone())?;
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::Builder::new().name("fairfeed-keys".into()).spawn(move || {
            // Nothing seen yet: the first look parses the file whatever it
            // holds (it may have changed since the keys in force were read).
            let mut seen: Option<Option<Vec<u8>>> = None;
            let mut since = Duration::ZERO;
            while !halt.load(Ordering::Relaxed) {
                std::thread::sleep(REQUEST_POLL);
                since += REQUEST_POLL;
                let asked = cell.reload.swap(false, Ordering::Relaxed);
                if !asked && since < KEY_POLL {
                    continue;
                }
                since = Duration::ZERO;
                let bytes = Some(std::fs::read(&path).ok());
                if !asked && bytes == seen {
                    continue;
                }
                seen = bytes;
                match read_keys(&path) {
                    Ok(keys) => {
                        if cell.put(keys.clone()) {
                            tracing::info!(
                                ids = ?keys.ids(),
                                send_id = keys.send_id(),
                                "tree keys from {}: accepting ids {:?}, sealing with {}",
                                path.display(),
                                keys.ids(),
                                keys.send_id()
                            );
                        }
                    }
                    Err(e) => {
                        tracing::warn!("tree keys not reloaded (the keys in force stay): {e}");
                        cell.failed(e.to_string());
                    }
                }
            }
        })?;
        Ok(KeyFileWatch { stop, thread: Some(thread) })
    }

    /// Leaves the thread running for the life of the process.
    pub fn detach(mut self) {
        self.thread.take();
    }
}

impl Drop for KeyFileWatch {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Relaxed);
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watch_puts_a_changed_file_in_force_and_keeps_the_keys_when_it_breaks() {
        let dir = std::env::temp_dir().join(format!("fairfeed-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tree.key");
        let (a, b) = ("ab".repeat(32), "cd".repeat(32));
        std::fs::write(&path, &a).unwrap();
        let cell = KeyCell::new(&read_keys(&path).unwrap());
        let watch = KeyFileWatch::start(path.clone(), cell.clone()).unwrap();
        let wait = |g: u64| {
            let t = std::time::Instant::now();
            while cell.generation() == g && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        std::fs::write(&path, format!("0 {a}\n1 {b} send\n")).unwrap();
        wait(0);
        assert_eq!((cell.keys().ids(), cell.keys().send_id(), cell.generation()), (vec![0, 1], 1, 1));
        std::fs::write(&path, "0 nonsense").unwrap();
        let t = std::time::Instant::now();
        while cell.stats().reload_errors == 0 && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = cell.stats();
        assert_eq!((s.reload_errors, cell.generation(), s.send_id), (1, 1, 1), "the keys in force stay: {s:?}");
        assert!(s.last_error.unwrap().contains("line 1"));
        // The same keyring written again (or asked for) changes nothing.
        std::fs::write(&path, format!("0 {a}\n1 {b} send\n")).unwrap();
        cell.ask_reload();
        std::thread::sleep(KEY_POLL * 3);
        assert_eq!(cell.generation(), 1);
        drop(watch);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
