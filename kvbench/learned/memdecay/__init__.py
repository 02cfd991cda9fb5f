"""MemDecay: region-aware eviction with per-region half-lives and base priorities. press.py is the press;
calibration.py measures the half-lives and priorities on a model (attention by region and age);
command.py is `kvbench memdecay calibrate`.
"""
