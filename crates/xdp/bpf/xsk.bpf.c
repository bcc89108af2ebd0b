// SPDX-License-Identifier: MIT OR Apache-2.0
//
// AF_XDP steering: every UDP/IPv4 datagram to the node's overlay port goes
// to the AF_XDP socket bound to the queue it arrived on (the XSKMAP entry
// of that queue); everything else — ARP, the control port, other traffic,
// and the port's datagrams on a queue with no socket — passes to the
// kernel stack as before.

#include "ff.h"

enum { XDP_DROP = 1, XDP_PASS = 2 };
enum { BPF_MAP_TYPE_ARRAY = 2, BPF_MAP_TYPE_PERCPU_ARRAY = 6, BPF_MAP_TYPE_XSKMAP = 17 };

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;

// Queues a node's sockets can be bound to.
#define QUEUES 64

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, QUEUES);
    __type(key, __u32);
    __type(value, __u32);
} ff_xsks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32); // the UDP destination port steered to the sockets
} ff_xsk_port SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, __u64); // [0] steered to a socket, [1] to the port but no socket on the queue (passed)
} ff_xsk_counters SEC(".maps");

SEC("xdp")
int ff_xdp_xsk(struct xdp_md *ctx) {
    const __u8 *data = (const __u8 *)(long)ctx->data;
    const __u8 *end = (const __u8 *)(long)ctx->data_end;
    // Ethernet II, IPv4 without options, UDP, not a fragment.
    if (data + 42 > end || data[12] != 0x08 || data[13] != 0x00 || data[14] != 0x45 || data[23] != 17)
        return XDP_PASS;
    if ((data[20] & 0x3f) != 0 || data[21] != 0)
        return XDP_PASS;
    __u32 k0 = 0, k1 = 1;
    __u32 *port = bpf_map_lookup_elem(&ff_xsk_port, &k0);
    if (!port || (((__u32)data[36] << 8) | data[37]) != *port)
        return XDP_PASS;
    __u32 q = ctx->rx_queue_index;
    long verdict = bpf_redirect_map(&ff_xsks, q, XDP_PASS);
    __u64 *n = bpf_map_lookup_elem(&ff_xsk_counters, verdict == XDP_PASS ? &k1 : &k0);
    if (n)
        *n += 1;
    return verdict;
}

char _license[] SEC("license") = "Dual MIT/GPL";
