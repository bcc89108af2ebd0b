// SPDX-License-Identifier: MIT OR Apache-2.0
//
// A measuring sink for benchmarks: counts and drops, in the driver, every
// UDP/IPv4 datagram to a port range (the far end of a link whose sending
// rate is being measured, at the least cost per datagram the kernel offers);
// everything else passes.

#include "ff.h"

enum { XDP_DROP = 1, XDP_PASS = 2 };
enum { BPF_MAP_TYPE_ARRAY = 2, BPF_MAP_TYPE_PERCPU_ARRAY = 6 };

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u32); // [0] lowest, [1] highest UDP destination port counted and dropped
} ff_sink_ports SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u64); // [0] datagrams dropped, [1] their bytes (UDP payload)
} ff_sink_counters SEC(".maps");

SEC("xdp")
int ff_xdp_sink(struct xdp_md *ctx) {
    const __u8 *data = (const __u8 *)(long)ctx->data;
    const __u8 *end = (const __u8 *)(long)ctx->data_end;
    if (data + 42 > end || data[12] != 0x08 || data[13] != 0x00 || data[14] != 0x45 || data[23] != 17)
        return XDP_PASS;
    __u32 port = ((__u32)data[36] << 8) | data[37];
    __u32 k0 = 0, k1 = 1;
    __u32 *lo = bpf_map_lookup_elem(&ff_sink_ports, &k0);
    __u32 *hi = bpf_map_lookup_elem(&ff_sink_ports, &k1);
    if (!lo || !hi || port < *lo || port > *hi)
        return XDP_PASS;
    __u64 *n = bpf_map_lookup_elem(&ff_sink_counters, &k0);
    __u64 *b = bpf_map_lookup_elem(&ff_sink_counters, &k1);
    if (n)
        *n += 1;
    if (b)
        *b += (((__u32)data[38] << 8) | data[39]) - 8;
    return XDP_DROP;
}

char _license[] SEC("license") = "Dual MIT/GPL";
