"""Multi-token prediction heads (Medusa style) for `--method heads`.

model.py the heads, data.py the target's cached hidden states over a code
corpus, train.py self-distillation, store.py the cache, __main__.py the CLI
(`python -m specviz.heads train`). The proposer is engine/proposers/heads.py."""
