"""The protocols' runs, one module each: `run(model, runs, sample)` answers `sample` for `runs` (one
sample's configs of that protocol, whose presses can share a prefill: `adapter.is_shareable`), filling each
run's `result` (what every question's row shares: `steps.kv_counts` and `prefill_s`) and appending to its
`answers` one dict per question asked (`tokens`, `decode_s`).

A protocol is registered by its `core.config.Protocol`, which names its run as a `module:function` target,
so that listing protocols imports none of this. A protocol of your own is one file holding its `Protocol`
and its run, registered with `kvbench.register_protocol` or the entry point group `kvbench.protocols`.
"""
