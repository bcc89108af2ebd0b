//! Goal: the bridge and its subscribers reach a broker that requires TLS and
//! authentication — user and password, nkey — and a wrong secret, a missing
//! one or an untrusted server is refused with the reason, in bounded time.
//!
//! Method: a CA and a server certificate for 127.0.0.1 made with `rcgen`;
//! Debian's nats-server with a configuration requiring TLS and listing a
//! user with a password and an nkey user (`nkeys` makes the pair); the bridge
//! publishing a generated feed as the password user, a subscriber reading it
//! as the nkey user, both trusting only the test's CA. Without nats-server the
//! tests say SKIPPED (and fail with FAIRFEED_REQUIRE_TOOLS=1).

mod common;
use common::have_server;

use std::path::Path;
use std::time::{Duration, Instant};

use fairfeed_bridge::publish::{wall_ns, Bridge, PublishConfig};
use fairfeed_bridge::route::{Granularity, RouteConfig};
use fairfeed_bridge::security::Security;
use fairfeed_bridge::server::LocalServer;
use fairfeed_bridge::subscribe::{subscribe, StopWhen, SubscribeConfig};
use fairfeed_feed::gen::{GenConfig, Generator};

/// A CA, and a server certificate for 127.0.0.1 signed by it: PEM files in `dir`.
fn certificates(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server.subject_alt_names.push(SanType::IpAddress([127, 0, 0, 1].into()));
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &ca_cert, &ca_key).unwrap();
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("server.pem"), server_cert.pem()).unwrap();
    std::fs::write(dir.join("server-key.pem"), server_key.serialize_pem()).unwrap();
    // A second CA the server's certificate does not chain to.
    let other = CertificateParams::new(Vec::<String>::new()).unwrap().self_signed(&KeyPair::generate().unwrap());
    std::fs::write(dir.join("other-ca.pem"), other.unwrap().pem()).unwrap();
}

/// Starts a server requiring TLS and one of two users; returns it and the nkey user's seed.
fn secure_server(dir: &Path) -> (LocalServer, String) {
    certificates(dir);
    let nkey = nkeys::KeyPair::new_user();
    let conf = format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  timeout: 2\n}}\n\
         authorization {{\n  users = [\n    {{ user: \"bridge\", password: \"pw-bridge-1\" }}\n    {{ nkey: \"{}\" }}\n  ]\n}}\n",
        dir.join("server.pem").display(),
        dir.join("server-key.pem").display(),
        nkey.public_key()
    );
    let path = dir.join("secure.conf");
    std::fs::write(&path, conf).unwrap();
    let server = LocalServer::start_with(0, None, &["-c", path.to_str().unwrap()]).unwrap();
    (server, nkey.seed().unwrap())
}

fn tls_url(server: &LocalServer) -> String {
    server.url.replace("nats://", "tls://")
}

fn password_user(dir: &Path, password: &str) -> Security {
    let f = dir.join(format!("pw-{password}"));
    std::fs::write(&f, format!("{password}\n")).unwrap();
    Security {
        user: Some("bridge".into()),
        password_file: Some(f),
        ca: Some(dir.join("ca.pem")),
        ..Security::default()
    }
}

#[test]
fn the_bridge_and_a_subscriber_authenticate_over_tls() {
    if !have_server() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (server, seed) = secure_server(d.path());
    let url = tls_url(&server);
    let seed_file = d.path().join("sub.nk");
    std::fs::write(&seed_file, &seed).unwrap();
    let sub_security =
        Security { nkey_file: Some(seed_file), ca: Some(d.path().join("ca.pem")), ..Security::default() };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let cfg = SubscribeConfig {
        url: url.clone(),
        subject: "ff.itch.>".into(),
        jetstream: None,
        stop: StopWhen {
            idle: Some(Duration::from_secs(5)),
            after: Some(Duration::from_secs(60)),
            ..StopWhen::default()
        },
        gaps: None,
        security: sub_security,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sub = rt.spawn(async move { subscribe(&cfg, Some(tx), |_, _| {}).await });
    rt.block_on(rx).expect("the nkey user subscribed over TLS");

    let feed: Vec<Vec<u8>> =
        Generator::new(GenConfig { seed: 6, messages: 5_000, symbols: 20, ..GenConfig::default() })
            .unwrap()
            .map(|p| p.payload)
            .collect();
    let mut pc = PublishConfig::new(&url);
    pc.security = password_user(d.path(), "pw-bridge-1");
    let route = RouteConfig { granularity: Granularity::Message, ..RouteConfig::default() };
    let mut bridge = Bridge::start(route, pc).expect("the password user connects over TLS");
    // Paced (this test is about credentials and TLS, not bursts): an unpaced
    // burst of 5,000 over TLS to a one-thread subscriber on a loaded machine
    // once made the server cut the subscriber off as a slow consumer.
    for (k, p) in feed.iter().enumerate() {
        bridge.handle_packet(p, wall_ns());
        if k % 100 == 99 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let report = bridge.finish(Duration::from_secs(30));
    let (got, _) = rt.block_on(sub).unwrap().unwrap();
    assert!(report.published > 5_000 && report.publish_errors == 0, "{report:?}");
    assert_eq!((got.publications, got.missing, got.duplicates), (report.published, 0, 0), "{got:?}");
}

#[test]
fn wrong_missing_or_untrusted_are_refused_with_the_reason() {
    if !have_server() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (server, _) = secure_server(d.path());
    let url = tls_url(&server);
    let dir = d.path();
    let cases: Vec<(&str, Security, &str)> = vec![
        ("a wrong password", password_user(dir, "wrong"), "authorization"),
        ("no credentials", Security { ca: Some(dir.join("ca.pem")), ..Security::default() }, "authorization"),
        (
            "a server its CA did not sign",
            Security { ca: Some(dir.join("other-ca.pem")), ..password_user(dir, "pw-bridge-1") },
            "certificate",
        ),
    ];
    std::thread::scope(|s| {
        let hs: Vec<_> = cases
            .into_iter()
            .map(|(what, sec, reason)| {
                let url = url.clone();
                s.spawn(move || {
                    let t0 = Instant::now();
                    let mut pc = PublishConfig::new(&url);
                    pc.security = sec;
                    let err =
                        Bridge::start(RouteConfig::default(), pc).err().unwrap_or_else(|| panic!("{what}: connected"));
                    assert!(matches!(err, fairfeed_bridge::BridgeError::Connect(_)), "{what}: {err:?}");
                    let err = err.to_string();
                    eprintln!("{what}: {err}");
                    assert!(t0.elapsed() < Duration::from_secs(15), "{what}: {:?}", t0.elapsed());
                    assert!(err.contains("no NATS connection") && err.contains("last error"), "{what}: {err}");
                    assert!(err.to_lowercase().contains(reason), "{what}: {err}");
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    // Settings that cannot work are refused before any connection attempt.
    let bad_seed = dir.join("bad.nk");
    std::fs::write(&bad_seed, "not-a-seed").unwrap();
    let mut pc = PublishConfig::new(&url);
    pc.security = Security { nkey_file: Some(bad_seed), ..Security::default() };
    let err = Bridge::start(RouteConfig::default(), pc).err().unwrap().to_string();
    assert!(err.contains("not an nkey seed"), "{err}");
    let mut pc = PublishConfig::new(&url);
    pc.security =
        Security { user: Some("bridge".into()), password_file: Some(dir.join("absent")), ..Security::default() };
    let err = Bridge::start(RouteConfig::default(), pc).err().unwrap();
    assert!(matches!(err, fairfeed_bridge::BridgeError::Secret(_)), "{err:?}");
    let err = err.to_string();
    assert!(err.contains("password file") && err.contains("absent"), "{err}");
}
