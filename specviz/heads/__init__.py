"""Training multi-token prediction heads (Medusa style) for `--method heads`.

data.py the target's cached hidden states over a code corpus, train.py
self-distillation, __main__.py the CLI (`python -m specviz heads train`). The
heads' model, their cache and the proposer are engine/proposers/heads.py."""
