#!/usr/bin/env python3
"""Compare fairfeed's ITCH 5.0 decoding with PyPI's itchfeed, field by field.

usage: itch_compare.py CAPTURE.pcap OURS.ndjson

CAPTURE is a classic pcap (Ethernet/IPv4/UDP, MoldUDP64 payloads); OURS is
`fairfeed decode CAPTURE --json`. The framing below is deliberately minimal and
independent of fairfeed; the ITCH layer is itchfeed's. Every field of every
message must agree in both directions (no field of either side left unmatched).
Exit 0 when all agree, 1 otherwise.
"""
import json
import struct
import sys

import itch.messages as M

# fairfeed field name -> itchfeed attribute name, where they differ.
RENAME = {
    "order_ref": "order_reference_number",
    "side": "buy_sell_indicator",
    "luld_reference_price_tier": "luld_ref",
    "level1": "level1_price",
    "level2": "level2_price",
    "level3": "level3_price",
    "ipo_quotation_release_time": "ipo_release_time",
    "ipo_quotation_release_qualifier": "ipo_release_qualifier",
    "auction_collar_extension": "auction_collar_extention",
    "price_variation_indicator": "variation_indicator",
    "original_order_ref": "order_reference_number",
    "new_order_ref": "new_order_reference_number",
}
OURS_META = {"packet", "capture_ns", "session", "seq", "type", "name"}
THEIRS_SKIP = {"price_precision"}


def pcap_udp_payloads(path):
    data = open(path, "rb").read()
    magic = data[:4]
    endian = {b"\xd4\xc3\xb2\xa1": "<", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">", b"\xa1\xb2\x3c\x4d": ">"}[magic]
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    assert linktype == 1, f"only Ethernet captures here, got linktype {linktype}"
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        eth = 14
        ethertype = struct.unpack("!H", frame[12:14])[0]
        while ethertype in (0x8100, 0x88A8):
            ethertype = struct.unpack("!H", frame[eth + 2:eth + 4])[0]
            eth += 4
        if ethertype != 0x0800 or frame[eth + 9] != 17:
            continue
        ihl = (frame[eth] & 0x0F) * 4
        udp = frame[eth + ihl:]
        ulen = struct.unpack("!H", udp[4:6])[0]
        yield udp[8:ulen]


def itch_messages(path):
    for payload in pcap_udp_payloads(path):
        count = struct.unpack("!H", payload[18:20])[0]
        if count in (0, 0xFFFF):
            continue
        p = 20
        for _ in range(count):
            n = struct.unpack("!H", payload[p:p + 2])[0]
            yield payload[p + 2:p + 2 + n]
            p += 2 + n


def theirs(msg):
    obj = M.messages[msg[:1]](msg)
    out = {}
    for k, v in vars(obj).items():
        if k in THEIRS_SKIP:
            continue
        if "price" in k:
            v = obj.decode_price(k)
        elif isinstance(v, bytes):
            v = v.decode("ascii").strip()
        out[k] = v
    return out


def same(ours, their):
    if isinstance(their, float):
        return float(ours) == their
    if isinstance(their, str):
        return str(ours).strip() == their
    return ours == their


def main():
    capture, ndjson = sys.argv[1], sys.argv[2]
    ours_all = [json.loads(line) for line in open(ndjson)]
    mismatches = fields = messages = 0
    types = set()
    theirs_all = list(itch_messages(capture))
    if len(theirs_all) != len(ours_all):
        print(f"message count differs: itchfeed framing {len(theirs_all)}, fairfeed {len(ours_all)}")
        return 1
    for i, (raw, ours) in enumerate(zip(theirs_all, ours_all)):
        t = theirs(raw)
        types.add(ours["type"])
        messages += 1
        matched = set()
        for k, v in ours.items():
            if k in OURS_META:
                continue
            tk = RENAME.get(k, k)
            if tk not in t:
                print(f"msg {i} type {ours['type']}: itchfeed has no field for {k}")
                mismatches += 1
                continue
            matched.add(tk)
            fields += 1
            if not same(v, t[tk]):
                print(f"msg {i} type {ours['type']} field {k}: fairfeed {v!r} itchfeed {t[tk]!r}")
                mismatches += 1
        for tk in set(t) - matched:
            print(f"msg {i} type {ours['type']}: fairfeed has no field for itchfeed's {tk}")
            mismatches += 1
    print(f"compared {messages} messages, {fields} fields, {len(types)} types ({''.join(sorted(types))}), {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
