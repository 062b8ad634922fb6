"""One process's in-memory pull + push time (issue 30: the table with the
disk tier compiled in but off must stay within 2% of the table before it).

    EXPECT=<checkout> OUT=<file> STEPS=250 PYTHONPATH=<checkout> \
        python tools/_tier_off_step.py

1M rows of dim 16 Adagrad imported, then STEPS Zipf(1.1) batches of 131072
ids (training pull + push); appends the median ms of the steps after the
first 10 to OUT. Run it for two checkouts alternately (e.g. farm-bench
--vs); EXPECT guards that the intended checkout's tnet was imported.
"""
import os
import time

import numpy as np
import tnet as tn
assert tn.__file__.startswith(os.environ["EXPECT"]), tn.__file__
rows=1_000_000; dim=16
t=tn.SparseTable("m",dim,tn.optimizer.Adagrad(0.05))
rng=np.random.default_rng(0)
t.import_rows(np.arange(rows,dtype=np.int64), rng.normal(0,.01,(rows,dim)).astype(np.float32), np.full((rows,t.num_slots),.1,np.float32), np.stack([np.ones(rows),np.zeros(rows),np.zeros(rows)],1))
g=rng.normal(0,.01,(131072,dim)).astype(np.float32)
ks=[(rng.zipf(1.1,131072)%rows).astype(np.int64) for _ in range(int(os.environ.get("STEPS","60")))]
ts=[]
for i,k in enumerate(ks):
    a=time.perf_counter(); t.pull(k,training=True).numpy(); t.push(k,g,step=i+1); ts.append(time.perf_counter()-a)
with open(os.environ["OUT"],"a") as f: f.write(f"{np.median(ts[10:])*1000:.3f}\n")
