//! A local `nats-server` for tests, the bench and the demo: started on a free
//! loopback port (optionally with JetStream and a store directory), killed on drop.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian puts the server, then the PATH.
pub fn find_server() -> Option<PathBuf> {
    for p in ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"] {
        if Path::new(p).is_file() {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("nats-server")).find(|p| p.is_file()))
}

/// A running server.
pub struct LocalServer {
    child: Child,
    pub port: u16,
    pub url: String,
    store: Option<PathBuf>,
    /// More arguments (a `-c` configuration: TLS, authorization; cluster routes).
    extra: Vec<String>,
}

fn spawn(port: u16, store: Option<&Path>, extra: &[String]) -> std::io::Result<Child> {
    let bin = find_server().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "nats-server not found: install it (Debian: apt-get install nats-server) or pass --nats URL",
        )
    })?;
    let mut cmd = Command::new(bin);
    cmd.args(["-a", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(dir) = store {
        cmd.arg("-js").arg("-sd").arg(dir);
    }
    cmd.args(extra);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    // Its own process group: a Ctrl-C at the terminal stops us, not the
    // broker under a run that is still going (the run would go on for
    // minutes against a dead server).
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    // ... and it dies with us, however we die (SIGTERM, SIGKILL, a panic):
    // no broker left behind. The signal follows the thread that spawned it,
    // so a LocalServer must not outlive the thread that started it.
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child before exec and calls only
    // prctl and getppid, which are async-signal-safe; it allocates nothing.
    unsafe {
        let parent = std::process::id();
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::other("parent exited"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

fn wait_ready(child: &mut Child, port: u16, limit: Duration) -> std::io::Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(status) = child.try_wait()? {
            return Err(std::io::Error::other(format!(
                "nats-server exited at start-up ({status}); port {port} in use?"
            )));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    Err(std::io::Error::other("nats-server did not accept connections within 10 s"))
}

impl LocalServer {
    /// Starts `nats-server` on 127.0.0.1 (`port` 0: a free one), with
    /// JetStream storing in `store` when given; waits until it accepts connections.
    pub fn start(port: u16, store: Option<&Path>) -> std::io::Result<LocalServer> {
        Self::start_with(port, store, &[])
    }

    /// [`LocalServer::start`] with more `nats-server` arguments, e.g.
    /// `["-c", "secure.conf"]` for TLS and authorization, or cluster routes.
    pub fn start_with(port: u16, store: Option<&Path>, extra: &[&str]) -> std::io::Result<LocalServer> {
        let port = if port == 0 { std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port() } else { port };
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut child = spawn(port, store, &extra)?;
        wait_ready(&mut child, port, Duration::from_secs(10))?;
        let url = format!("nats://127.0.0.1:{port}");
        Ok(LocalServer { child, port, url, store: store.map(Path::to_path_buf), extra })
    }

    /// Kills the server and starts it again on the same port and store (a broker restart).
    pub fn restart(&mut self, down_for: Duration) -> std::io::Result<()> {
        self.kill();
        std::thread::sleep(down_for);
        self.revive()
    }

    /// Kills the server (a broker crash); [`LocalServer::revive`] starts it again.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a killed server again on the same port and store.
    pub fn revive(&mut self) -> std::io::Result<()> {
        self.child = spawn(self.port, self.store.as_deref(), &self.extra)?;
        wait_ready(&mut self.child, self.port, Duration::from_secs(10))
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
