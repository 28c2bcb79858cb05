# The commands that made the shipped drafts, in order (docs/trained_drafts.md embeds this file under
# "Commands"; scripts/drafts_card.py). A log, not a script to run: folders are named in <>.
python -m specviz heads data --tokens 1000000  # the pass (resumable; stopped by hand)
python -m specviz heads all --minutes 32 --medusa-minutes 7 --ship  # EAGLE, Medusa, accept
# 2026-11-29, later: the pass resumed to 661k tokens, the head trained on from the first one
python -m specviz heads data --tokens 1000000  # resumed
python -m specviz heads all --init eagle-first.pt --minutes 45 --medusa-minutes 10 \
  --lr 4e-4 --ship
# 2026-11-29, evening: the pass to its end, the head 50 minutes more, the trained exit
python -m specviz heads data --tokens 1000000 --out <the pass folder>  # resumed to 1,000,659
python -m specviz heads eagle --resume --minutes 162 --lr 7.5e-4 --epochs 50 \
  --precision w4a8 --data <the pass folder>  # --minutes counts the checkpoint's 112 too
python -m specviz heads exit --layer 6 --minutes 10 --data <the pass folder>
# 2026-11-29, night: the target's own answers (self-distillation), the head 42 minutes on both
python -m specviz heads answers --minutes 60 --out <the answers folder>
python -m specviz heads eagle --init <the 163-min checkpoint> --minutes 40 --lr 4e-4 --epochs 50 \
  --precision w4a8 --data <the pass folder> --also <the answers folder> --also-times 3
# 2026-11-30: the answers resumed to 249,788 tokens, the head 42 minutes more on both
python -m specviz heads answers --minutes 55 --out <the answers folder>  # resumed
python -m specviz heads eagle --init <the 205-min checkpoint> --minutes 42 --lr 3e-4 --epochs 50 \
  --precision w4a8 --data <the pass folder> --also <the answers folder> --also-times 4
# 2026-11-30, later: the answers resumed (stopped by hand), 15 min of the target's raw code
# completions, the head 40 minutes more on the three
python -m specviz heads answers --minutes 45 --out <the answers folder>  # resumed
python -m specviz heads answers --raw-code --minutes 15 --out <the raw answers folder>
python -m specviz heads eagle --init <the last checkpoint> --minutes 40 --lr 3e-4 --epochs 50 \
  --precision w4a8 --data <the pass folder> --also-times 4 \
  --also <the answers folder>,<the raw answers folder> \
  --note "<this stretch in a few words>" --ship  # the head it replaces: into the history
python -m specviz heads accept --kinds eagle  # held-out acceptance into the report
# 2026-11-30, morning: the kept LM heads in 4-bit codes (eagle_head.KEPT_LOWBIT), measured
python -m specviz heads accept  # every trained draft, into its report
# and the fused taps tried (not shipped): two layers' inputs beside the answers folders
python -m specviz heads taps --data <the answers folder> --also <the raw answers folder>
python scripts/drafts_card.py --pass-dir <the pass folder> --answers-dir <the answers folder>,<the raw answers folder>  # this card
# 2026-11-30, later: fresh answers (8 prompts a batched generate), a fine-tune from the shipped head (not shipped)
python -m specviz heads answers --at-once 8 --start 1500 --minutes 40 --out <a new answers folder>
python -m specviz heads answers --raw-code --at-once 8 --start 200 --minutes 12 --out <a new raw answers folder>
python -m specviz heads eagle --init assets/drafts/b0e025e7e782d89f/eagle.pt --minutes 35 --epochs 50 --lr 2e-4 \
  --precision w4a8 --data <a 30,822-token pass> --also <the two new folders> --also-times 3
python scripts/drafts_card.py  # the card again, its data lines kept (the pass folder is gone)
