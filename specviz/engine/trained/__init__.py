"""Trained drafts' parts the engine reads: EAGLE's head (eagle_head.py) and where trained files live
(store.py: shipped in assets/drafts/, else cached). specviz/heads/ trains them."""
