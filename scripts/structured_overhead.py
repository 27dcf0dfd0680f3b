"""Where a constrained 16-row lossless run spends its time: grammar hooks vs the step.

PYTHONPATH=src python scripts/structured_overhead.py
"""

import cProfile
import pstats

import s2d2
from s2d2.tasks.tiny_gsm.splits import load_split

qs = [p["question"] for p in load_split("test")[:48]]
m = s2d2.load("tiny-gsm", max_num_seqs=16)
m.generate_batch(qs[:16], max_new_tokens=8, regex=r"[^#]*#### [0-9]+")
pr = cProfile.Profile()
pr.enable()
m.generate_batch(qs, max_new_tokens=64, preset="lossless", regex=r"[^#]*#### [0-9]+")
pr.disable()
st = pstats.Stats(pr)
tot = st.total_tt
rows = {f"{k[0].split('/')[-1]}:{k[2]}": v[3] for k, v in st.stats.items()}
for name in [
    "llm_engine.py:step",
    "constrained.py:attach_masks",
    "constrained.py:conforming_picks",
    "step_math.py:_upload_grammar",
    "bitmask.py:masked_rows",
    "step_math.py:run_queries",
    "fastpath.py:forward",
]:
    print(name, round(rows.get(name, 0), 3))
