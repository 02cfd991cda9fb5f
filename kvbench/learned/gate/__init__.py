"""Gate: learned sigmoid gates per (layer, KV head) on a frozen pretrained model, trained soft, evicting hard.

After I-Hung Li's study of learned gated eviction (the soft-to-hard mismatch: during training a
differentiable gate attenuates a token's contribution, at inference memory is saved only when the entry is
physically removed). gates.py holds the gates (g_j = sigmoid(w . [k_j; v_j] + b), one (w, b) per layer and
KV head) and the soft attention (log g_j added to the attention logits of every later query); train.py
trains them on the frozen model (KL to the ungated next-token distribution + a sparsity term to a target
keep fraction); press.py is the hard press (`--press gate`), entries evicted by gate rank to the budget,
and the gates' files (the learned presses' one format, kvbench.learned.common.state).
"""
