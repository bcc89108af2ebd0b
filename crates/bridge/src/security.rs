//! How the bridge and its subscribers prove who they are to the broker and
//! protect the connection: NATS user and password, token, nkey or JWT
//! credentials file, and TLS (a CA to trust, a client certificate for mutual
//! TLS, TLS required). Secrets come from files, never from the command line
//! (where `ps` shows them).

use crate::BridgeError;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use async_nats::ConnectOptions;

/// Where a client's secrets and TLS material come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    /// User name; its password comes from `password_file`.
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
    /// A file holding an authentication token.
    pub token_file: Option<PathBuf>,
    /// A file holding an nkey seed (`SU…`; the server lists the public key `U…`).
    pub nkey_file: Option<PathBuf>,
    /// A JWT credentials file (`.creds`, as `nsc` writes them).
    pub creds_file: Option<PathBuf>,
    /// CA certificate(s) (PEM) the server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// Client certificate and its key (PEM), for servers that verify clients.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Refuse to talk to a server that does not offer TLS.
    pub require_tls: bool,
}

fn read_secret(what: &str, p: &PathBuf) -> Result<String, BridgeError> {
    let s = std::fs::read_to_string(p)
        .map_err(|e| BridgeError::Secret(format!("reading the {what} file {}: {e}", p.display())))?;
    let s = s.trim().to_string();
    if s.is_empty() {
        return Err(BridgeError::Secret(format!("the {what} file {} is empty", p.display())));
    }
    Ok(s)
}

impl Security {
    /// Checks that the settings go together: one way to authenticate at
    /// most, a password with its user, a key with its certificate.
    pub fn validate(&self) -> Result<(), BridgeError> {
        let ways =
            [self.user.is_some(), self.token_file.is_some(), self.nkey_file.is_some(), self.creds_file.is_some()];
        if ways.iter().filter(|&&w| w).count() > 1 {
            return Err(BridgeError::Config(
                "give one of --nats-user, --nats-token-file, --nats-nkey-file, --nats-creds".into(),
            ));
        }
        if self.user.is_some() != self.password_file.is_some() {
            return Err(BridgeError::Config("--nats-user and --nats-password-file go together".into()));
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(BridgeError::Config("--nats-cert and --nats-key go together".into()));
        }
        Ok(())
    }

    /// Whether anything is set.
    pub fn is_default(&self) -> bool {
        *self == Security::default()
    }

    /// `o` with these settings (reading the secret files now).
    pub async fn apply(&self, mut o: ConnectOptions) -> Result<ConnectOptions, BridgeError> {
        self.validate()?;
        if let (Some(user), Some(p)) = (&self.user, &self.password_file) {
            o = o.user_and_password(user.clone(), read_secret("password", p)?);
        }
        if let Some(p) = &self.token_file {
            o = o.token(read_secret("token", p)?);
        }
        if let Some(p) = &self.nkey_file {
            let seed = read_secret("nkey seed", p)?;
            // A seed that is not one would fail at every connection attempt, silently.
            nkeys::KeyPair::from_seed(&seed)
                .map_err(|e| BridgeError::Config(format!("{}: not an nkey seed: {e}", p.display())))?;
            o = o.nkey(seed);
        }
        if let Some(p) = &self.creds_file {
            o = o
                .credentials_file(p)
                .await
                .map_err(|e| BridgeError::Config(format!("reading the credentials file {}: {e}", p.display())))?;
        }
        for p in [&self.ca, &self.cert, &self.key].into_iter().flatten() {
            std::fs::metadata(p).map_err(|e| BridgeError::Config(format!("{}: {e}", p.display())))?;
        }
        if let Some(ca) = &self.ca {
            o = o.add_root_certificates(ca.clone());
        }
        if let (Some(c), Some(k)) = (&self.cert, &self.key) {
            o = o.add_client_certificate(c.clone(), k.clone());
        }
        if self.require_tls || self.ca.is_some() || self.cert.is_some() {
            o = o.require_tls(true);
        }
        Ok(o)
    }
}

/// The last error the client reported while connecting (authorization
/// refused, TLS handshake failed, …), for the message when no connection
/// comes up: "no connection" alone sends people looking at the network.
#[derive(Debug, Clone, Default)]
pub struct LastError(Arc<Mutex<Option<String>>>);

impl LastError {
    /// Notes an event of the client if it is an error.
    pub fn note(&self, e: &async_nats::Event) {
        let text = match e {
            async_nats::Event::ServerError(s) => format!("the server said: {s}"),
            async_nats::Event::ClientError(c) => format!("{c}"),
            _ => return,
        };
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(text);
    }

    /// " (last error: …)", or nothing.
    pub fn suffix(&self) -> String {
        match self.0.lock().unwrap_or_else(PoisonError::into_inner).as_deref() {
            Some(e) => format!(" (last error: {e})"),
            None => String::new(),
        }
    }
}

/// The servers of `url`: one URL, or several separated by commas (the nodes
/// of a cluster; the client also learns the others from the server it reaches).
pub fn servers(url: &str) -> Result<Vec<async_nats::ServerAddr>, BridgeError> {
    url.split(',')
        .map(|u| {
            u.trim()
                .parse::<async_nats::ServerAddr>()
                .map_err(|e| BridgeError::Connect(format!("`{u}` is not a NATS URL: {e}")))
        })
        .collect()
}

/// One connection attempt to `url` with `security`, without retrying: its
/// error in full (the retrying client reports only its kind, e.g. "IO
/// error" for an untrusted certificate), or `None` if it connects.
pub async fn diagnose(url: &str, security: &Security) -> Option<String> {
    let o = match security.apply(ConnectOptions::new()).await {
        Ok(o) => o,
        Err(e) => return Some(e.to_string()),
    };
    let servers = match servers(url) {
        Ok(s) => s,
        Err(e) => return Some(e.to_string()),
    };
    let attempt = tokio::time::timeout(std::time::Duration::from_secs(3), o.connect(servers)).await;
    match attempt {
        Ok(Ok(_)) => None,
        // Its Display includes its source (the TLS or server reason).
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some("no answer within 3 s".into()),
    }
}
