//! Compiles the eBPF programs in `bpf/` with clang's BPF target. Without
//! clang the crate still builds: the programs are then missing, and loading
//! one fails at run time with an error that names the cause. The script runs
//! again when clang appears (installed after a first build) or changes: it
//! watches the clang it used, or — none found — every directory on `PATH`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where `clang` (a bare name, looked up on `PATH`, or a path) is.
fn locate(clang: &str) -> Option<PathBuf> {
    if clang.contains('/') {
        return Path::new(clang).is_file().then(|| PathBuf::from(clang));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(clang)).find(|p| p.is_file())
}

/// Asks cargo to run this script again when `clang` changes or appears.
fn watch(clang: &str) {
    println!("cargo:rerun-if-env-changed=PATH");
    match locate(clang) {
        Some(p) => println!("cargo:rerun-if-changed={}", p.display()),
        None if clang.contains('/') => {
            if let Some(d) = Path::new(clang).parent().filter(|d| d.is_dir()) {
                println!("cargo:rerun-if-changed={}", d.display());
            }
        }
        None => {
            // Installing clang adds a file to one of these, which changes its mtime.
            let path = std::env::var_os("PATH").unwrap_or_default();
            for d in std::env::split_paths(&path).filter(|d| d.is_dir()) {
                println!("cargo:rerun-if-changed={}", d.display());
            }
        }
    }
}

const PROGRAMS: &[&str] = &["dedup", "replicate", "sink", "xsk"];

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    println!("cargo:rerun-if-env-changed=CLANG");
    watch(&clang);
    let mut status = String::from("ok");
    println!("cargo:rerun-if-changed=bpf/ff.h");
    for p in PROGRAMS {
        let src = format!("bpf/{p}.bpf.c");
        println!("cargo:rerun-if-changed={src}");
        let obj = out.join(format!("{p}.bpf.o"));
        let res = Command::new(&clang)
            .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c", &src, "-o"])
            .arg(&obj)
            .output();
        let failed = match res {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(format!("{clang} failed on {src}: {}", String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => Some(format!("{clang} not found ({e})")),
        };
        if let Some(why) = failed {
            println!("cargo:warning=fairfeed-xdp: {why}; the XDP fast path will be unavailable");
            std::fs::write(&obj, b"").expect("write an empty object");
            status = why.replace('\n', " ");
        }
    }
    println!("cargo:rustc-env=FAIRFEED_BPF_BUILD={status}");
}
