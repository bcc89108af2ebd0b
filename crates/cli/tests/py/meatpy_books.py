#!/usr/bin/env python3
"""Rebuild order books with PyPI's MeatPy, an ITCH 5.0 limit-order-book
builder nobody here wrote, from two ITCH files — the whole feed, and what a
receiver that joined mid-feed handed its application (a GLIMPSE-style
snapshot, then the live line) — and say whether they agree.

Usage: meatpy_books.py WHOLE JOINED [SYMBOLS]

Both files are NASDAQ's binary ITCH layout (each message after a 2-byte
big-endian length). The books are compared for the SYMBOLS most active
stocks of the whole feed (default 6: MeatPy runs one processor per stock),
level by level, best price first, each level's orders (reference, shares)
in MeatPy's queue priority. Prints one JSON object on stdout:
{"stocks": {LOCATE: {"bids": [[price, [[ref, shares], ...]], ...],
"asks": ...}}, "equal": bool, "first_difference": str|null}
for the whole feed's books, so the caller can set them beside its own.
Exit 0 when the two agree, 1 when they differ, 2 on bad input.
"""

import collections
import datetime
import json
import struct
import sys

from meatpy.itch50 import ITCH50MarketProcessor
from meatpy.lob import LimitOrderBook
from meatpy.itch50.itch50_market_message import (
    AddOrderMessage,
    AddOrderMPIDMessage,
    ITCH50MarketMessage,
    StockDirectoryMessage,
)

DAY = datetime.datetime(2026, 11, 27)


# Order messages: MeatPy must read every one of them.
BOOK_TYPES = b"AFEXCDU"
# Types MeatPy could not read (struct sizes of its own), by (file, type): left out.
SKIPPED = collections.Counter()
# The file whose books are being built (None while the busiest stocks are found).
READING = [None]


def messages(path):
    """MeatPy's messages from an ITCH file. MeatPy 0.5 reads the Direct
    Listing with Capital Raise message ('O') as 52 bytes where ITCH 5.0 has
    48, so its own reader stops there; the framing is read here and a
    message MeatPy cannot parse is skipped and counted — unless it is an
    order message, which would change the books (then this fails)."""
    data = open(path, "rb").read()
    i = 0
    while i + 2 <= len(data):
        n = int.from_bytes(data[i : i + 2], "big")
        body = data[i + 2 : i + 2 + n]
        i += 2 + n
        try:
            yield ITCH50MarketMessage.from_bytes(body)
        except struct.error:
            if body[:1] in [bytes([t]) for t in BOOK_TYPES]:
                raise
            SKIPPED[(READING[0], body[:1].decode("ascii", "replace"))] += 1


def busiest(path, n):
    """(locate, stock) of the n stocks with the most Add Orders."""
    names, adds = {}, collections.Counter()
    for m in messages(path):
        if isinstance(m, StockDirectoryMessage):
            names[m.stock_locate] = m.stock
        elif isinstance(m, (AddOrderMessage, AddOrderMPIDMessage)):
            adds[m.stock_locate] += 1
    return [(loc, names[loc]) for loc, _ in adds.most_common(n) if loc in names]


# Executions MeatPy found out of price-time priority (an order executed
# while another stood before it at its level), per file read. MeatPy
# applies each by its order reference either way; by default it raises
# later, from a path that then fails on its own level bookkeeping, so its
# hook for exceptions to skip counts them instead.
OUT_OF_PRIORITY = collections.Counter()


def _skip(_lob, _e):
    OUT_OF_PRIORITY[READING[0]] += 1
    return True


LimitOrderBook.skip_exception = _skip


def books(path, stocks):
    READING[0] = path
    procs = {loc: ITCH50MarketProcessor(name, DAY) for loc, name in stocks}
    for m in messages(path):
        for p in procs.values():
            p.process_message(m)
    out = {}
    for loc, p in procs.items():
        lob = p.current_lob
        side = lambda levels: [[lv.price, [[o.order_id, o.volume] for o in lv.queue]] for lv in levels]
        out[str(loc)] = {
            "bids": side(lob.bid_levels) if lob else [],
            "asks": side(lob.ask_levels) if lob else [],
        }
    return out


def first_difference(a, b):
    for loc in sorted(a, key=int):
        for s in ("bids", "asks"):
            x, y = a[loc][s], b.get(loc, {}).get(s, [])
            for i, (lx, ly) in enumerate(zip(x, y)):
                if lx != ly:
                    return f"stock {loc} {s} level {i}: whole feed {lx}, joined {ly}"
            if len(x) != len(y):
                return f"stock {loc} {s}: {len(x)} levels in the whole feed, {len(y)} joined"
    return None


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    whole, joined = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) == 4 else 6
    stocks = busiest(whole, n)
    if not stocks:
        print("no stock with an Add Order in the whole feed", file=sys.stderr)
        return 2
    a, b = books(whole, stocks), books(joined, stocks)
    diff = first_difference(a, b)
    skipped = {t: n for (path, t), n in SKIPPED.items() if path == whole}
    report = {"stocks": a, "equal": diff is None, "first_difference": diff, "skipped_whole": skipped}
    report["out_of_priority"] = {"whole": OUT_OF_PRIORITY[whole], "joined": OUT_OF_PRIORITY[joined]}
    print(json.dumps(report))
    return 0 if diff is None else 1


if __name__ == "__main__":
    sys.exit(main())
