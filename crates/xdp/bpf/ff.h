// SPDX-License-Identifier: MIT OR Apache-2.0
//
// What fairfeed's eBPF programs share: the kernel's integer types, the
// section and map-definition macros, and the XDP context — written out here
// so the programs need no kernel or libbpf headers, only clang's BPF target.

#ifndef FF_BPF_H
#define FF_BPF_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;

#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name
#define INLINE static inline __attribute__((always_inline))

struct xdp_md {
    __u32 data;
    __u32 data_end;
    __u32 data_meta;
    __u32 ingress_ifindex;
    __u32 rx_queue_index;
    __u32 egress_ifindex;
};

#endif
