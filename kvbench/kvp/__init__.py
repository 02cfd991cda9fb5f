"""KVP: learned per-head KV-cache eviction agents ("Learning to Evict from Key-Value Cache", ICML 2026).

datagen.py stores keys, values and each prompt token's future utility from uncompressed runs over a training
mixture (kvbench.tasks.mixture); train.py fits one small scorer per (layer, KV head) on them with
Plackett-Luce policy gradients (reward.py); agent.py holds the scorers (two architectures: compact, and
Apple's); checkpoint.py reads and writes agents; kvbench/presses/kvp.py is the press that uses them.
"""
