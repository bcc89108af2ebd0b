// SPDX-License-Identifier: MIT OR Apache-2.0
//
// fairfeed's XDP de-duplicator: Jasper's receiver fast path (seed 000,
// section 7.2 and appendix A, Algorithm 1). Hedged copies of one overlay data
// packet reach a receiver over H+1 paths; the first is passed to the stack
// and the rest are dropped here, before the kernel builds an skb for them.
//
// Algorithm 1 keeps a power-of-two ring indexed by sequence number (XDP has
// no modulo and no unbounded maps). Ours keys each slot by (tree, sequence,
// authentication tag): a copy is dropped only when a copy with the same
// sequence number *and the same 128-bit tag* was passed before. Copies of a
// genuine packet carry the sender's tag unchanged (it covers every byte but
// the hop count), so they all match; a forged packet cannot carry the genuine
// tag without the tree's key, so it can never make the genuine copy look like
// a duplicate. At worst a forgery costs a pass to user space, which checks
// the tag and refuses it. The program never refuses anything on its own
// authority: everything it does not recognise as a repeat is passed.
//
// Self-contained on purpose: no kernel or libbpf headers are needed, only
// clang with its BPF target.

#include "ff.h"

enum { XDP_ABORTED = 0, XDP_DROP = 1, XDP_PASS = 2 };
enum { BPF_MAP_TYPE_ARRAY = 2, BPF_MAP_TYPE_PERCPU_ARRAY = 6 };

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;

// Slots remembered: a power of two, equal to the user-space window
// (fairfeed_tree::dedup::WINDOW) so both forget at the same distance.
#define SLOTS 65536
// The overlay header (fairfeed_wire::overlay): 40 bytes, big-endian.
#define OV_MAGIC 0xFA1F
#define OV_VERSION 2
#define OV_KIND_DATA 1
#define OV_HEADER_LEN 40
#define OV_FLAG_AUTH 0x01
#define TAG_LEN 16
// Payloads longer than this are left to user space: the verifier needs a
// small bound on a variable packet offset, and XDP frames are one page.
#define PAYLOAD_MAX 4096

// Counter indices (fairfeed_xdp::Counter keeps the same order).
enum {
    C_DATA = 0,        // overlay data packets to our port examined
    C_FIRST = 1,       // first copy of a sequence number: passed
    C_DUPLICATE = 2,   // same tree, sequence and tag as one passed: dropped
    C_TAG_DIFFERS = 3, // same sequence, different tag (forged or corrupt): passed
    C_TOO_OLD = 4,     // older than the slot's sequence (reordered past the window): passed
    C_UNPARSED = 5,    // our port, but cut short, not overlay data, or payload > PAYLOAD_MAX: passed
    C_OTHER = 6,       // not UDP/IPv4 to our port: passed untouched
    COUNTERS = 7,
};

struct slot {
    __u64 seq;
    __u64 tag0;
    __u64 tag1;
    __u32 tree;
    __u32 valid;
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, SLOTS);
    __type(key, __u32);
    __type(value, struct slot);
} ff_slots SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, COUNTERS);
    __type(key, __u32);
    __type(value, __u64);
} ff_counters SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32); // UDP destination port, host order; 0 = every port
} ff_config SEC(".maps");

INLINE int count(__u32 idx, int verdict) {
    __u64 *c = bpf_map_lookup_elem(&ff_counters, &idx);
    if (c)
        *c += 1;
    return verdict;
}

INLINE __u16 be16(const __u8 *p) { return (__u16)((p[0] << 8) | p[1]); }

INLINE __u64 be64(const __u8 *p) {
    __u64 v = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

INLINE __u64 raw64(const __u8 *p) {
    __u64 v = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
        v |= (__u64)p[i] << (8 * i);
    return v;
}

SEC("xdp")
int ff_xdp_dedup(struct xdp_md *ctx) {
    const __u8 *data = (const __u8 *)(long)ctx->data;
    const __u8 *end = (const __u8 *)(long)ctx->data_end;

    // Ethernet, IPv4 (unfragmented), UDP.
    if (data + 14 > end)
        return count(C_OTHER, XDP_PASS);
    if (be16(data + 12) != 0x0800)
        return count(C_OTHER, XDP_PASS);
    const __u8 *ip = data + 14;
    if (ip + 20 > end)
        return count(C_OTHER, XDP_PASS);
    __u32 ihl = (__u32)(ip[0] & 0x0f) * 4;
    if ((ip[0] >> 4) != 4 || ihl < 20 || ip[9] != 17)
        return count(C_OTHER, XDP_PASS);
    if (be16(ip + 6) & 0x3fff) // a fragment: leave it to the stack
        return count(C_OTHER, XDP_PASS);
    const __u8 *udp = ip + ihl;
    if (udp + 8 > end)
        return count(C_OTHER, XDP_PASS);
    __u32 zero = 0;
    __u32 *port = bpf_map_lookup_elem(&ff_config, &zero);
    if (!port)
        return count(C_OTHER, XDP_PASS);
    if (*port != 0 && be16(udp + 2) != *port)
        return count(C_OTHER, XDP_PASS);
    __u32 udp_len = be16(udp + 4);

    // The overlay header.
    const __u8 *ov = udp + 8;
    if (ov + OV_HEADER_LEN > end || udp_len < 8 + OV_HEADER_LEN)
        return count(C_UNPARSED, XDP_PASS);
    if (be16(ov) != OV_MAGIC || ov[2] != OV_VERSION || ov[3] != OV_KIND_DATA)
        return count(C_UNPARSED, XDP_PASS);
    __u32 tree = be16(ov + 4);
    __u64 seq = be64(ov + 8);
    __u32 len = be16(ov + 36);
    __u64 tag0 = 0, tag1 = 0;
    if (ov[7] & OV_FLAG_AUTH) {
        // The tag follows the payload, inside the UDP datagram.
        if (len > PAYLOAD_MAX || udp_len != 8 + OV_HEADER_LEN + len + TAG_LEN)
            return count(C_UNPARSED, XDP_PASS);
        const __u8 *tag = ov + OV_HEADER_LEN + (len & (2 * PAYLOAD_MAX - 1));
        if (tag + TAG_LEN > end)
            return count(C_UNPARSED, XDP_PASS);
        tag0 = raw64(tag);
        tag1 = raw64(tag + 8);
    }
    count(C_DATA, 0);

    __u32 idx = (__u32)((seq + (__u64)tree * 40503u) & (SLOTS - 1));
    struct slot *s = bpf_map_lookup_elem(&ff_slots, &idx);
    if (!s)
        return XDP_PASS;
    if (s->valid && s->tree == tree && s->seq == seq) {
        if (s->tag0 == tag0 && s->tag1 == tag1)
            return count(C_DUPLICATE, XDP_DROP);
        // A different packet under the same number: let user space judge
        // it; remember the latest so a genuine copy after a forgery still
        // lets its own later copies be dropped.
        s->tag0 = tag0;
        s->tag1 = tag1;
        return count(C_TAG_DIFFERS, XDP_PASS);
    }
    if (s->valid && s->tree == tree && seq < s->seq)
        return count(C_TOO_OLD, XDP_PASS);
    s->valid = 0;
    s->seq = seq;
    s->tree = tree;
    s->tag0 = tag0;
    s->tag1 = tag1;
    s->valid = 1;
    return count(C_FIRST, XDP_PASS);
}

char _license[] SEC("license") = "Dual MIT/GPL";
