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
- Compressed prefix caching (`--press NAME --ratio R`): every policy's entries (blocks, states, chunks)
  are compressed by a press of kvbench's registry before they go into the store, each entry on its own:
  kvpress's prefill hook is called on a one-layer cache holding only the entry's keys and values, with the
  entry's own hidden states and position embeddings as queries (kvpress's ChunkPress compresses each chunk
  of a context so; `adapter.compress_entry`). An entry is a unit the store keeps or drops whole, so its
  compression cannot depend on what a later request puts beside it.
- The request that computes an entry answers from the full KV it just computed; the entry is compressed
  after the first token (`compress_s`, outside TTFT, as inserting is) and only later requests attend to the
  compressed entry. A serving system has that full KV in hand, and compression is what it pays to keep more
  of it; so a miss costs what it costs uncompressed, and the error is where the reuse is. Ratio 0 (kvpress's
  presses leave the entry as it is) gives exactly the uncompressed policy's logits and answers, bit for bit.
- Positions count tokens, not entries held: tokens after a compressed entry sit where they would after the
  full one (kvpress's protocol, continuing from the uncompressed length); the kept keys keep their RoPE
  positions, so the chunk policy's rotation and Pegasus's transitions apply to compressed entries as they
  are. A transition is made only between two states of a chunk that hold the same number of entries.
- Bytes of a compressed entry: its kept entries at 16 bits, as kvbench's rows count an evictor's
  `kv_bytes`; the budget is checked against those, so more entries fit the same budget. Accuracy is what
  compression costs, measured as for `chunk`: first-token logits and answers against the full recompute.
- Only presses that compress inside kvpress's hook are offered (scorers and their wrappers, learned ones
  included: knorm, snapkv, tova, kvp, ...); presses that change the forward, mask heads (AdaKV) or
  compress while decoding cannot compress one entry alone, and codecs are refused because their groups
  (32 tokens for quant) are longer than a 16-token block. A SnapKV-style window must be shorter than the
  shortest entry (`--press-arg window_size=N`).
"""
