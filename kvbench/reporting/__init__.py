"""`kvbench report`: leaderboards, tables and plots (markdown + self-contained HTML) from results folders.

A results folder holds its rows (one per config and sample, see kvbench.store.results) and `runs/*.json` (one
record per invocation: command, config, versions, git commit). Reports never average across models,
context lengths or protocols: there is one leaderboard per (model, length, protocol with its arguments);
the rows of `kvbench perplexity` (NLLs, not scores) are on none of them: they get a section of their own.

Each leaderboard has up to three views. The ratio view ranks evictors by compression ratio (fraction of KV
entries removed, kvpress's meaning). The budget view ranks configs given an absolute budget (`budget=N`:
KV entries kept per head and layer), with a plot of score against it (KVP's paper's Figure 2). The memory
view, shown whenever rows record bytes (`kv_bytes`) or were run with a memory budget, puts evictors and
codecs on one axis, the memory fraction kv_bytes / kv_bytes_full (for rows without bytes, kv_kept /
kv_total). A codec press (quantisation, low rank, ...) keeps entries at fewer bits, so its ratio says
nothing about the entries it removed: a config run with a ratio whose memory fraction differs from its
kept-entry fraction is a codec config, left out of the ratio view and shown in the memory view at the
budget its press was built with (1 - ratio, as the press registry builds it). Under multi-question and
multi-turn, a table gives each config's score by question or by turn.

One concern a module, each importing only those before it: read (rows, runs, labels), stats (means,
intervals right at small n, paired differences), boards (the leaderboards and their views), plots, blocks
(the document: headings, paragraphs, tables of cells), render (markdown, and HTML through
templates/report.html.j2, from the same blocks; `render_report`), browser (headless Chromium: the
screenshot), command (`kvbench report`); perplexity (before render) draws the rows of `kvbench
perplexity`, which hold NLLs rather than scores, in a section of their own.
"""

from kvbench.reporting.render import render_report

__all__ = ["render_report"]
