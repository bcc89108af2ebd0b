//! Compiles the eBPF programs in `bpf/` with clang's BPF target. Without
//! clang the crate still builds: the programs are then missing, and loading
//! one fails at run time with an error that names the cause.

use std::path::PathBuf;
use std::process::Command;

const PROGRAMS: &[&str] = &["dedup", "replicate", "sink", "xsk"];

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    println!("cargo:rerun-if-env-changed=CLANG");
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
