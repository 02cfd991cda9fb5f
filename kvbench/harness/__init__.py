"""From what a user asks to rows: planning, the runner, Ray, the lm-eval bridge, live-cache perplexity, and
kvpress evaluation's output folders to and from rows."""
