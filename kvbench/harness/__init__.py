"""From what a user asks to rows: planning, the runner, Ray, the lm-eval bridge, live-cache
perplexity, press speed, the conformance kit, the serving benchmark and the substrate study."""
