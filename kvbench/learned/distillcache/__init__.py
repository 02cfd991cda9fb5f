"""DistillCache: a learned eviction policy trained with per-step KL rewards (arXiv 2608.08878).

policy.py computes each cache entry's features and scores them with a small MLP shared by every head, and
samples keep-sets (Gumbel-top-k); its training data is the learned presses' shared store
(learned.common.datagen: per training prompt of the mixture, the features, keys and values of the context
and the uncompressed model's next-token distributions over a teacher-forced continuation, among others);
train.py runs the frozen model on caches compressed by sampled keep-sets and reinforces the keep-sets whose
next-token distributions stay closest (KL) to the uncompressed ones; press.py is the press, and reads and
writes the policy (the learned presses' one format, kvbench.learned.common.state).
"""
