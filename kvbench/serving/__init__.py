"""Prefix caching as a serving benchmark: replay a request trace on a real model against a byte-budgeted
prefix store, policy by policy, and measure time to first token, hit rate, reuse and accuracy against a full
recompute. `trace` makes and reads traces, `store` is the tree of cached entries and its eviction orders,
`replay` runs the model; `kvbench prefix-cache` is the command.

Pegasus (Chen, Li, Yu et al.) has no public code or full text; the stateful policy is designed from its
abstract. The choices it leaves open, and why:

- States are keyed by (path, chunk) where the path is the exact sequence of chunk ids before the chunk: the
  KV of a chunk after a given path is then exactly what a full prefill computes, so a run of hits from the
  start of the prompt reuses it without error. A state is usable only if the states of its path are held too
  (the question attends to all of them), so states form a tree and a hit is a prefix of the request's chunks.
  This makes the stateful store a chunk-granular radix tree; what differs from exact-prefix caching is the
  eviction value and the transitions.
- RPPC's value is access count x latency saved / bytes. Latency saved is a cost model, not a measurement:
  recomputing n tokens after an offset o costs n (1 + (o + n/2) / 1000) token units (a linear term plus the
  attention to what precedes: recomputing a late chunk costs more than an early one, the "asymmetric latency
  benefit"). The 1/1000 is a round figure for a small model on a CPU, where the linear layers dominate.
- "Recursive path pruning": eviction takes leaves only, the one of least value first, so a path is pruned from
  its tip; dropping a state drops its subtree and any transition based on it.
- Transitions: when RPPC evicts a state of chunk c and another state of c (under another path) is held, the
  evicted state is kept as base + sparse delta (the entries that differ by more than `transition_tol` after
  the base's keys are rotated to the target's positions), at 16-bit values and 32-bit indices; if that is not
  smaller than the state, it is dropped. A request that reaches a transition rebuilds the state from its base
  (no attention recomputed, no tensor reloaded) and goes on matching below it. The error this brings is
  measured (first-token logits against the full recompute), and so is the sparsity per layer (the fraction
  of entries kept). Transitions are made at eviction, not on the request path; they are not made from paths
  never computed, since the delta needs the true state once.
- Stateless chunk reuse computes each chunk alone from position 0 and rotates its keys to where the chunk
  sits in the prompt (RoPE composes); it loses the attention across chunks, the error the abstract trades.
- Exact-prefix reuse: blocks of `block` tokens (16, as vLLM's default), LRU over leaves (SGLang's radix
  cache; vLLM's free-block queue is LRU over blocks no request uses).
- TTFT is the wall time of what a policy does before the first token's logits: lookup, assembly, position
  shifts, transition application and the prefill of what is missing, question included. Inserting new
  entries and evicting (demotions included) come after the first token and are not in TTFT; they are
  counted as bookkeeping (the store's time) and demotion time (tensor work) apart.
- Bytes: every cached token costs layers x 2 x KV heads x head_dim x 2 bytes (16 bits, as kvbench's rows
  count them), whatever the dtype the model runs in. The budget must hold at least one block.
- Not built: compressing the cached states with a kvbench press (compressed prefix caching); see the study
  page.
"""
