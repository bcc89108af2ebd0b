#!/usr/bin/env python3
"""Summarizes scripts/exchange-matrix.sh runs (JSON per run in DIR) as Markdown: medians, every run's p99."""
import json,glob,statistics as st,os,collections
import sys
O=sys.argv[1]
def load(f):
    try: return json.load(open(f))
    except Exception: return None
rows=collections.defaultdict(list)
for f in sorted(glob.glob(O+'/matrix-*.json')):
    d=load(f)
    if not d: continue
    name=os.path.basename(f)[len('matrix-'):].rsplit('-r',1)[0]
    rows[name].append(d)
def med(v): return st.median(v)
print('| pipeline | orders/s asked | products | runs | achieved (median) | acknowledged | p50 µs | p95 µs | p99 µs (runs) | max µs | TCP ping-pong p99 µs | p99 ÷ TCP p99 |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|')
def key(n):
    p,r,pr=n.rsplit('-',2); return (p,int(r))
for n in sorted(rows,key=key):
    ds=rows[n]; p,r,pr=n.rsplit('-',2)
    p99s=sorted(d['p99_us'] for d in ds)
    ratio=med([d['p99_us']/d['baseline_tcp_rtt_p99_us'] for d in ds])
    ack=all(d['orders']==d['responses'] for d in ds)
    fmt=lambda x: f"{x:,.1f}" if x<1e4 else f"{x:,.0f}"
    print(f"| {p} | {int(r):,} | {pr} | {len(ds)} | {med([d['achieved_rate'] for d in ds]):,.0f} | {'all' if ack else 'NO'} | {fmt(med([d['p50_us'] for d in ds]))} | {fmt(med([d['p95_us'] for d in ds]))} | {fmt(med(p99s))} ({', '.join(fmt(x) for x in p99s)}) | {fmt(med([d['max_us'] for d in ds]))} | {med([d['baseline_tcp_rtt_p99_us'] for d in ds]):.1f} | {ratio:.1f} |")
print()
at=collections.defaultdict(list)
for f in sorted(glob.glob(O+'/attack-*.json')):
    d=load(f)
    if not d: continue
    at[os.path.basename(f)[len('attack-'):].rsplit('-r',1)[0]].append(d)
base=med([d['p99_us'] for d in at.get('none',[])]) if at.get('none') else None
print('| attack | runs | acknowledged | p50 µs | p99 µs (runs) | p99 ÷ no attack | RSS at end, MiB | what the attacker managed | what the gateway counted |')
print('|---|---|---|---|---|---|---|---|---|')
for a in ['none','idle-connections','slow-reader','login-guessing','garbage']:
    ds=at.get(a,[])
    if not ds: continue
    p99s=sorted(d['p99_us'] for d in ds)
    g=ds[-1]['gateway']; s=ds[-1].get('attack_stats')
    gk={k:v for k,v in g.items() if v and k not in ('orders_in','logins','sequenced_out')}
    print(f"| {a} | {len(ds)} | {'all' if all(d['orders']==d['responses'] for d in ds) else 'NO'} | {med([d['p50_us'] for d in ds]):.1f} | {med(p99s):.1f} ({', '.join(f'{x:.0f}' for x in p99s)}) | {med(p99s)/base:.2f} | {med([d['rss_end_kib'] for d in ds])/1024:.1f} | {json.dumps(s) if s else '—'} | {json.dumps(gk) if gk else '—'} |")
