"""Summarize the diag build's per-CTA stamps of early copies (`diag-stamps.patch`): for each request the
copy CTAs took early, when each CTA saw it published, finished its span, and counted the task landed.

    python stamps.py engine_stamps.npy
"""

import sys

import numpy as np

a = np.load(sys.argv[1])
ctas, slots, dev = int(a[0]), int(a[1]), a[2:]
base = 16 + 4 * slots + 4 * ctas                  # DEV_HEADER + per-slot words + early state
d = dev[base : base + 4 * 64 * ctas].reshape(64, ctas, 4)   # [request % 64, cta, (q, seen, span done, counted)]
rows = []
for r in d:
    if (r[:, 0] == 0).all() or len(set(r[:, 0].tolist())) != 1:
        continue
    seen, done, counted = r[:, 1], r[:, 2], r[:, 3]
    t0 = seen.min()
    rows.append((int(r[0, 0]), seen.max() - t0, np.median(done - seen), done.max() - t0, counted.max() - t0))
rows.sort()
print("request  seen spread  median CTA copy  last span done  last counted   (us from the first CTA's sight)")
for q, *t in rows:
    print(f"{q:7d}  " + "  ".join(f"{x / 1e3:13.1f}" for x in t))
m = np.median(np.array([r[1:] for r in rows]), axis=0) / 1e3
print(f"median   {m[0]:13.1f}  {m[1]:13.1f}  {m[2]:13.1f}  {m[3]:13.1f}")
