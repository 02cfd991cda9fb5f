"""KVP: learned per-head KV-cache eviction agents ("Learning to Evict from Key-Value Cache", ICML 2026).

Its training data is the learned presses' shared store (kvbench.learned.common.datagen: keys, values and each
prompt token's future utility, among others, from uncompressed runs over a training mixture); train.py fits
one small scorer per (layer, KV head) on them with Plackett-Luce policy gradients (reward.py); agent.py holds
the scorers (two architectures: compact, and Apple's); checkpoint.py reads and writes agents;
kvbench/learned/kvp/press.py is the press that uses them.
"""
