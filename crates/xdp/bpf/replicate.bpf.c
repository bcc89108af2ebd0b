// SPDX-License-Identifier: MIT OR Apache-2.0
//
// fairfeed's TC egress replicator: Jasper's sender- and proxy-side fast path
// (seed 000, section 7.2). The node writes each data packet once, to its
// first target; this program, on the egress hook of the interface it leaves
// by, makes the copies for every other child and hedge target with
// bpf_clone_redirect(): destination address and port rewritten (and the
// destination MAC where the target table gives one), IPv4 and UDP checksums
// fixed incrementally, then the original goes on to the first target.
//
// Only UDP/IPv4 packets from the node's own port to its first target that
// carry an overlay data header are replicated; reports, probes and anything
// else pass untouched. The copies are addressed to other targets, so they
// never match again when they come back through this hook.

#include "ff.h"

// Marks a clone for its way back through this hook (skb->mark is host-local
// metadata, cleared when a packet crosses into another namespace).
#define CLONE_MARK 0xFA1F0C0Fu

struct __sk_buff {
    __u32 len, pkt_type, mark, queue_mapping, protocol, vlan_present, vlan_tci, vlan_proto;
    __u32 priority, ingress_ifindex, ifindex, tc_index, cb[5], hash, tc_classid, data, data_end;
};

enum { TC_ACT_OK = 0 };
enum { BPF_MAP_TYPE_ARRAY = 2, BPF_MAP_TYPE_PERCPU_ARRAY = 6 };
#define BPF_F_PSEUDO_HDR (1ULL << 4)
#define BPF_F_MARK_MANGLED_0 (1ULL << 5)

static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_skb_store_bytes)(struct __sk_buff *skb, __u32 off, const void *from, __u32 len, __u64 flags) = (void *)9;
static long (*bpf_l3_csum_replace)(struct __sk_buff *skb, __u32 off, __u64 from, __u64 to, __u64 size) = (void *)10;
static long (*bpf_l4_csum_replace)(struct __sk_buff *skb, __u32 off, __u64 from, __u64 to, __u64 flags) = (void *)11;
static long (*bpf_clone_redirect)(struct __sk_buff *skb, __u32 ifindex, __u64 flags) = (void *)13;
static long (*bpf_loop)(__u32 nr_loops, void *callback_fn, void *callback_ctx, __u64 flags) = (void *)181;

// Targets per packet at most (children and hedge targets of one node).
#define TARGETS_MAX 64
// Offsets in an Ethernet + 20-byte IPv4 + UDP frame.
#define OFF_IP 14
#define OFF_IP_CSUM (OFF_IP + 10)
#define OFF_IP_DST (OFF_IP + 16)
#define OFF_UDP (OFF_IP + 20)
#define OFF_UDP_DPORT (OFF_UDP + 2)
#define OFF_UDP_CSUM (OFF_UDP + 6)
#define OFF_OV (OFF_UDP + 8)

struct target {
    __u32 ip;     // network order
    __u16 port;   // network order
    __u8 mac[6];  // used when the config says so (every target has one, or none)
    __u32 pad;
};
_Static_assert(sizeof(struct target) == 16, "fairfeed_xdp::TcReplicator writes 16 bytes");

struct config {
    __u32 targets; // how many entries of ff_targets are live (the first is the one the node sends to)
    __u16 sport;   // the node's UDP port, network order
    __u16 macs;    // non-zero: rewrite the destination MAC from each target's entry
};
_Static_assert(sizeof(struct config) == 8, "fairfeed_xdp::TcReplicator writes 8 bytes");

// Counter indices (fairfeed_xdp::ReplicateCounters keeps the same order).
enum {
    C_PACKETS = 0,   // packets replicated
    C_COPIES = 1,    // copies made by clone_redirect
    C_FAILED = 2,    // clone_redirect or a rewrite failed
    C_PASSED = 3,    // packets left alone
    COUNTERS = 4,
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, TARGETS_MAX);
    __type(key, __u32);
    __type(value, struct target);
} ff_targets SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct config);
} ff_rconfig SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, COUNTERS);
    __type(key, __u32);
    __type(value, __u64);
} ff_rcounters SEC(".maps");

INLINE int count(__u32 idx, __u64 n, int verdict) {
    __u64 *c = bpf_map_lookup_elem(&ff_rcounters, &idx);
    if (c)
        *c += n;
    return verdict;
}

// Where the packet points now, and what the loop counted.
struct walk {
    struct __sk_buff *skb;
    __u32 ip;     // current destination, network order
    __u32 port;   // current destination port, network order
    __u32 ifindex;
    __u32 macs;
    __u64 copies;
    __u64 failed;
};

// Points the packet from the walk's current destination at `to`: checksums
// first, then the bytes; returns non-zero if any step failed.
INLINE long retarget(struct walk *w, const struct target *to) {
    long err = 0;
    err |= bpf_l4_csum_replace(w->skb, OFF_UDP_CSUM, w->ip, to->ip, BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0 | 4);
    err |= bpf_l3_csum_replace(w->skb, OFF_IP_CSUM, w->ip, to->ip, 4);
    err |= bpf_skb_store_bytes(w->skb, OFF_IP_DST, &to->ip, 4, 0);
    err |= bpf_l4_csum_replace(w->skb, OFF_UDP_CSUM, w->port, to->port, BPF_F_MARK_MANGLED_0 | 2);
    err |= bpf_skb_store_bytes(w->skb, OFF_UDP_DPORT, &to->port, 2, 0);
    if (w->macs)
        err |= bpf_skb_store_bytes(w->skb, 0, to->mac, 6, 0);
    w->ip = to->ip;
    w->port = to->port;
    return err;
}

// One copy: to target i + 1 (bpf_loop's callback; the verifier checks it
// once, not once per target).
static __attribute__((noinline)) long copy_to(__u32 i, void *ctx) {
    struct walk *w = ctx;
    __u32 k = i + 1;
    struct target *t = bpf_map_lookup_elem(&ff_targets, &k);
    if (!t)
        return 1;
    long err = retarget(w, t);
    w->skb->mark = CLONE_MARK;
    err |= bpf_clone_redirect(w->skb, w->ifindex, 0);
    if (err)
        w->failed++;
    else
        w->copies++;
    return 0;
}

SEC("classifier")
int ff_tc_replicate(struct __sk_buff *skb) {
    // A copy this program made, back on its way out: nothing to do.
    if (skb->mark == CLONE_MARK)
        return TC_ACT_OK;
    const __u8 *data = (const __u8 *)(long)skb->data;
    const __u8 *end = (const __u8 *)(long)skb->data_end;
    if (data + OFF_OV + 4 > end)
        return count(C_PASSED, 1, TC_ACT_OK);
    const __u8 *ip = data + OFF_IP;
    const __u8 *udp = data + OFF_UDP;
    const __u8 *ov = data + OFF_OV;
    if (data[12] != 0x08 || data[13] != 0x00 || ip[0] != 0x45 || ip[9] != 17)
        return count(C_PASSED, 1, TC_ACT_OK);
    // Overlay data: magic FA1F, version 2, kind 1.
    if (ov[0] != 0xFA || ov[1] != 0x1F || ov[2] != 2 || ov[3] != 1)
        return count(C_PASSED, 1, TC_ACT_OK);
    __u32 zero = 0;
    struct config *cfg = bpf_map_lookup_elem(&ff_rconfig, &zero);
    struct target *first = bpf_map_lookup_elem(&ff_targets, &zero);
    if (!cfg || !first || cfg->targets < 2)
        return count(C_PASSED, 1, TC_ACT_OK);
    __u16 sport = *(const __u16 *)(udp + 0);
    __u16 dport = *(const __u16 *)(udp + 2);
    __u32 dst = *(const __u32 *)(ip + 16);
    if (sport != cfg->sport || dport != first->port || dst != first->ip)
        return count(C_PASSED, 1, TC_ACT_OK);
    __u32 n = cfg->targets;
    if (n > TARGETS_MAX)
        n = TARGETS_MAX;
    __u32 mark = skb->mark;
    struct walk w = { .skb = skb, .ip = first->ip, .port = first->port, .ifindex = skb->ifindex, .macs = cfg->macs };
    bpf_loop(n - 1, copy_to, &w, 0);
    // The original goes on to the first target, with its own mark.
    skb->mark = mark;
    w.failed += (retarget(&w, first) != 0);
    __u64 copies = w.copies, failed = w.failed;
    count(C_COPIES, copies, 0);
    if (failed)
        count(C_FAILED, failed, 0);
    return count(C_PACKETS, 1, TC_ACT_OK);
}

char _license[] SEC("license") = "Dual MIT/GPL";
