#!/usr/bin/env bash
# Regenerates every committed report (reports/reference*/ and reports/board-*/: README.md, index.html, plots) from the committed
# rows (results/reference*/rows.jsonl.gz), with the commands README.md and TRAINING.md quote. Run from the
# repository root: bash reports/render.sh. index.html is not committed (.gitignore); README.md and the PNGs
# are. Each line is one report, commented with the study (README.md / TRAINING.md section) that quotes it.
#
# Checked on the compressed rows: reference-4k, reference-cuda and reference-recent-window render again.
# Fourteen reports (reference-heldout, -confirm, -third, -fourth, -fifth, -recent-window, -after-choice,
# -after-choice-more, -after-choice-fifth, -high-ratio-agents, -heldout-agents, -reconstruction-agents,
# -reconstruction-agents-seen, -mixed-agents) were rendered before their folders got rows of the shipped
# agents (kvp state e4a3abdbc3db; TRAINING.md, "which default rows were swept again"): rendered again, their
# `kvp` is the shipped agents and the agents they reported drop out (kept, as kvp@58260c05679a, with
# --every-state, which reproduces the committed numbers).
set -euo pipefail
cd "$(dirname "$0")/.."

# README "Reference leaderboard (embedded model, RULER at 1k tokens)"; its screenshot.png is the page as
# headless Chromium shows it (apt-get install chromium), remade with the report.
# Without Chromium the script stops here, before any report: a screenshot left as it was would no longer
# show its report (KVBENCH_NO_SCREENSHOT=1 renders the rest and says the screenshot is stale).
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
    uv run kvbench report results/reference --out reports/reference --versus kvp --screenshot
elif [ "${KVBENCH_NO_SCREENSHOT:-}" = 1 ]; then
    echo "KVBENCH_NO_SCREENSHOT=1: reports/reference/screenshot.png is now stale; remake it with Chromium" >&2
    uv run kvbench report results/reference --out reports/reference --versus kvp
else
    echo "chromium not found (apt-get install chromium), needed for reports/reference/screenshot.png;" \
        "KVBENCH_NO_SCREENSHOT=1 renders the rest without it" >&2
    exit 1
fi
# README "Out of distribution: the held-out suite"
uv run kvbench report results/reference-heldout --out reports/reference-heldout --versus kvp
# README "A second held-out suite, to confirm"
uv run kvbench report results/reference-confirm --out reports/reference-confirm --versus kvp
# README "A recent window for KVP: tried, and it loses"; TRAINING "A recent window for KVP"
uv run kvbench report results/reference-heldout results/reference-confirm results/reference-recent-window --out reports/reference-recent-window --versus kvp
# README "A third held-out suite"
uv run kvbench report results/reference-third --out reports/reference-third --versus kvp
# README "A fourth held-out suite, and agents trained for high ratios"
uv run kvbench report results/reference-fourth --out reports/reference-fourth --versus kvp
uv run kvbench report results/reference-confirm results/reference-third results/reference-fourth --out reports/reference-after-choice --versus kvp --presses kvp,streaming_llm,knorm,distillcache,h2o,snapkv,tova,expected_attention
# TRAINING "Agents trained for high ratios, and the fourth suite that judges them"
uv run kvbench report results/reference-heldout results/reference-confirm results/reference-third results/reference-high-ratio-agents --out reports/reference-high-ratio-agents --versus kvp
# README "Beyond those seven heuristics: kvpress's other presses, and where KVZip wins"
uv run kvbench report results/reference-{confirm,third,fourth} results/reference-{confirm,third,fourth}-more --out reports/reference-after-choice-more --versus kvp --presses kvp,compactor,leverage,cap,kvzip,lagkv,non_causal_attention,keydiff,pyramidkv,cur,streaming_llm,knorm
# README "A fifth held-out suite, and agents trained on KVZip's target"; TRAINING "Agents trained on reconstruction attention"
uv run kvbench report results/reference-fifth results/reference-fifth-more --out reports/reference-fifth --versus kvp
uv run kvbench report results/reference results/reference-reconstruction-agents --out reports/reference-reconstruction-agents --versus kvp
uv run kvbench report results/reference-heldout results/reference-confirm results/reference-reconstruction-agents-seen --out reports/reference-reconstruction-agents-seen --versus kvp --presses "kvp,kvp(agents=/work/agents/ruler-reconstruction),streaming_llm,knorm"
uv run kvbench report results/reference-{confirm,third,fourth,fifth} --out reports/reference-after-choice-fifth --versus kvp --presses kvp,streaming_llm,knorm,distillcache,h2o,snapkv,tova,expected_attention
# README "A sixth held-out suite, and the agents shipped now"; TRAINING "The mixed-target agents, and the sixth suite"
uv run kvbench report results/reference-sixth --out reports/reference-sixth --versus kvp --every-state --presses kvp,kvp@58260c05679a,tova,streaming_llm,knorm,snapkv,h2o,expected_attention,distillcache,gate
uv run kvbench report results/reference-qwen-ruler-1k --out reports/reference-qwen-ruler-1k --versus kvp
uv run kvbench report results/reference-{confirm,third,fourth,fifth,sixth} --out reports/reference-after-choice-sixth --versus kvp --every-state --presses kvp,kvp@58260c05679a,streaming_llm,knorm,distillcache,h2o,snapkv,tova,expected_attention,gate
uv run kvbench report results/reference-{confirm,third,fourth,sixth} --out reports/reference-after-choice-sixth-without-fifth --versus kvp --every-state --presses kvp,kvp@58260c05679a,streaming_llm,knorm,distillcache,h2o,snapkv,tova,expected_attention
uv run kvbench report results/reference-heldout --out reports/reference-heldout-mixed-agents --versus kvp --every-state --presses kvp,kvp@58260c05679a,streaming_llm,knorm,distillcache,h2o,snapkv,tova,expected_attention
uv run kvbench report results/reference results/reference-mixed-agents --out reports/reference-mixed-agents --versus kvp
# TRAINING "Ablation" (held-out suite: each training set minus the shipped agents)
uv run kvbench report results/reference-heldout results/reference-heldout-agents --out reports/reference-heldout-agents --versus kvp
# README "Memory leaderboard (embedded model, RULER at 1k tokens, by bytes)"
uv run kvbench report results/reference-memory --out reports/reference-memory --versus kvp
# performance.md "The cost board at 1k and 4k": the memory board beside what kvbench speed measured
uv run kvbench report results/reference-memory --out reports/reference-memory-costs --costs results/study-costs
# README "Agent traces under the streaming protocol"
uv run kvbench report results/reference-agent-ratio --out reports/reference-agent-ratio --versus kvp --every-state
uv run kvbench report results/reference-agent-streaming --out reports/reference-agent-streaming --versus kvp --every-state --presses "kvp,kvp@58260c05679a,distillcache,snapkv,streaming_llm,tova,memdecay(scored_queries=all),h2o,qevict(scored_queries=all),knorm"
# docs/studies/protocols.md: query-aware RULER against absolute budgets (KVP's paper's Figure 2 form)
uv run kvbench report results/reference-query-aware --out reports/reference-query-aware --versus kvp
# docs/studies/protocols.md: compress once answer four, multi-turn, and the same questions alone (held-out)
uv run kvbench report results/reference-multi-question --out reports/reference-multi-question --versus kvp
# docs/studies/protocols.md: live-cache perplexity against absolute budgets
uv run kvbench report results/reference-perplexity --out reports/reference-perplexity
# README "At 4k tokens: beyond what the embedded model can do"
uv run kvbench report results/reference-4k --out reports/reference-4k
# README "On a GPU (measured on an NVIDIA H200)"
uv run kvbench report results/reference-cuda --out reports/reference-cuda

# docs/studies/qevict-recovery.md
uv run kvbench report results/reference-qevict-recovery --out reports/reference-qevict-recovery --versus qevict

# docs/studies/gate.md "On the six held-out suites": the gate against every heuristic, paired, pooled over six suites
uv run kvbench report results/reference-{heldout,confirm,third,fourth,fifth,sixth} --out reports/reference-gate-heldout --versus gate --presses gate,kvp,streaming_llm,tova,knorm,h2o,snapkv,expected_attention,distillcache
# docs/studies/gate.md "On the memory board": the gate press beside the learned presses and the heuristics
uv run kvbench report results/reference-memory --out reports/reference-gate-memory --versus kvp --presses gate,kvp,distillcache,streaming_llm,knorm,quant
# docs/studies/gate.md "The soft-to-hard gap with trained gates": the table and gap.png again from the committed
# rows.jsonl (hard) and soft.json (soft): --skip-hard, and soft.json present, so no model runs
uv run python benchmarks/gate_gap.py --out reports/reference-gate-gap --texts 4 --length 256 --skip-hard
# docs/studies/distillcache-per-step.md: the per-step candidate judged on the third suite, and RULER in distribution
uv run kvbench report results/reference-third results/reference-per-step-third --out reports/reference-per-step-third --versus distillcache --presses "kvp,distillcache,distillcache(weights=agents/dc-per-step),streaming_llm,knorm"
uv run kvbench report results/reference-per-step-ruler --out reports/reference-per-step-ruler --versus distillcache
# docs/studies/decode-heavy.md: the presses under decode-time and query-agnostic on long answers
uv run kvbench report results/reference-decode-heavy --out reports/reference-decode-heavy --versus kvp
# docs/studies/learned-presses-at-equal-cost.md: the learned-press board
P="kvp,kvzap,kvzap(model_type=linear),fastkvzip,qfilter,expected_attention_stats,duo_attention,distillcache,gate,kvzip,streaming_llm,knorm,snapkv,tova"
uv run kvbench report results/board-learned-heldout results/reference-fifth-more --presses "$P" --versus kvp --costs results/board-learned-costs --out reports/board-learned-heldout
uv run kvbench report results/board-learned-heldout results/reference-fifth-more --presses "$P" --versus kvzip --out reports/board-learned-heldout-kvzip
uv run kvbench report results/board-learned-ruler --versus kvp --costs results/board-learned-costs --out reports/board-learned-ruler
uv run kvbench report results/board-learned-ruler --versus kvzip --out reports/board-learned-ruler-kvzip
uv run kvbench report results/board-learned-qwen --versus kvp --out reports/board-learned-qwen

# The plots as committed: palette PNGs, a third of matplotlib's size, alike to the eye (apt-get install pngquant).
if command -v pngquant >/dev/null; then
    pngquant --force --ext .png --quality 80-100 --speed 1 --strip --skip-if-larger reports/reference*/*.png reports/board-*/*.png \
        || echo "pngquant left some plots as they were (exit 98: not smaller, 99: quality)" >&2
else
    echo "pngquant not found: the plots stay full size (about 15.6 MB instead of 5.2 MB)" >&2
fi
