#!/usr/bin/env python3
"""Seed the fuzz corpora from captures: fuzz/seed_corpus.py CAPTURE.pcap [...]

Writes UDP payloads (moldudp64), single ITCH messages (itch), whole frames
prefixed by an Ethernet link selector byte (frame) and each capture's payloads
as one sharder input (shard: a tree-count byte, then length-prefixed packets)
and as one snapshot-service input (snapshot: selector 0 — a feed datagram — and
a length before each payload)
under fuzz/corpus/<target>/,
so the fuzzers start from real structure instead of from nothing.
"""
import hashlib
import os
import struct
import sys

here = os.path.dirname(os.path.abspath(__file__))


def put(target, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def frames(path):
    data = open(path, "rb").read()
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack(endian + "I", data[off + 8:off + 12])[0]
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


for path in sys.argv[1:]:
    shard = bytearray([3])
    snap = bytearray()
    for n, fr in enumerate(frames(path)):
        if n > 300:
            break
        put("frame", b"\x00" + fr)
        udp = fr[14 + (fr[14] & 15) * 4:]
        payload = udp[8:struct.unpack("!H", udp[4:6])[0]]
        put("moldudp64", payload)
        if len(shard) + 2 + len(payload) <= 2048:
            shard += struct.pack("!H", len(payload)) + payload
        if len(snap) + 3 + len(payload) <= 2048:
            snap += struct.pack("!BH", 0, len(payload)) + payload
        if len(payload) >= 20 and struct.unpack("!H", payload[18:20])[0] not in (0, 0xFFFF):
            p = 20
            while p + 2 <= len(payload):
                ln = struct.unpack("!H", payload[p:p + 2])[0]
                put("itch", payload[p + 2:p + 2 + ln])
                p += 2 + ln
    put("shard", bytes(shard))
    put("snapshot", bytes(snap))
