//! `BPF_PROG_TEST_RUN`: the kernel runs a loaded program once on a buffer we
//! give it and reports the return code. aya 0.13 has no wrapper, so this is
//! the one raw `bpf(2)` call of the crate.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd};

/// The leading part of `union bpf_attr` for `BPF_PROG_TEST_RUN` (the kernel
/// takes a shorter struct than it knows, zero-extended).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs `prog` once on `data`; its return code.
pub(crate) fn run(prog: BorrowedFd<'_>, data: &[u8]) -> std::io::Result<u32> {
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: data.len() as u32,
        data_in: data.as_ptr() as u64,
        repeat: 1,
        ..TestRunAttr::default()
    };
    // SAFETY: `attr` is a valid, initialised prefix of `union bpf_attr`; the
    // kernel reads `data` (alive for the call) and writes only `attr`.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_PROG_TEST_RUN, &raw mut attr, std::mem::size_of::<TestRunAttr>() as u32)
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(attr.retval)
}
