"""Every bad input to every command is one line naming the culprit, the right exit code, no traceback, and
nothing written. The table runs without loading a model: the cheap checks (names, numbers, files, press
arguments, devices, lengths against the model's context) must all fire before it."""

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench.bridge import models
from kvbench.cli import main
from kvbench.core.errors import ResultsWriteError
from kvbench.harness.planning import parse_ratio
from kvbench.learned.kvp.agent import KVPAgents
from kvbench.learned.kvp.checkpoint import save_agents
from kvbench.store import results
from kvbench.store.results import ResultsStore, Row, load_rows
from kvbench.tasks import longbench

RUN = ["run", "--press", "snapkv", "--ratio", "0.5"]
SWEEP = ["sweep", "--presses", "snapkv", "--ratios", "0.5"]
LM_EVAL = ["lm-eval", "--press", "snapkv", "--ratio", "0.5", "--tasks", "kvbench_niah_single_1"]
DATAGEN = ["kvp", "datagen", "--out", "{tmp}/out"]
TRAIN = ["kvp", "train", "--out", "{tmp}/out"]
OUT = ["--out", "{tmp}/out"]
PPL = ["perplexity", "--presses", "streaming_llm"]
REAL_WRITE, REAL_LOAD_MODEL = os.write, models.load_model
LONG = "{tmp}/" + "a" * 300  # a name longer than the file system takes (255 bytes)
# Every kind of path a command reads, given a name too long: the first lookup (is_file, exists) raises.
LONG_PATHS = [
    [*RUN, "--suite", f"{LONG}.yaml", *OUT],
    [*RUN, "--data", f"{LONG}.jsonl", *OUT],
    [*RUN[:2], f"{LONG}.py:P", *RUN[3:], *OUT],
    [*RUN, "--data", "{tmp}/mine.jsonl", "--metric", f"{LONG}.py:f", *OUT],
    [*RUN, "--include-path", LONG, *OUT],
    ["tasks", "--include-path", LONG],
    [*RUN, "--model", LONG, *OUT],
    [*RUN, "--tokenizer", LONG, *OUT],
    [*RUN[:2], "kvp", *RUN[3:], "--press-arg", f"agents={LONG}", *OUT],
    [*TRAIN, "--data", LONG],
    ["kvp", "report", LONG],
    ["import", "--format", "kvpress", LONG, "{tmp}/out"],
    ["export", "--format", "kvpress", LONG, "{tmp}/out"],
    ["report", "{tmp}/scored", "--costs", LONG, *OUT],
    [*PPL, "--budget", "64", "--data-dir", LONG, *OUT],
]

# (arguments, exit code, what the one line must name). "{tmp}" is the test's folder of prepared files.
CASES = [
    *[(args, 2, "a path is too long for the file system") for args in LONG_PATHS],
    # training never writes over learned state unasked (--replace), nor into a data store
    (
        [*TRAIN[:2], "--out", "{tmp}/compact", "--data", "{tmp}/store"],
        2,
        "'{tmp}/compact' already holds learned",
    ),
    ([*TRAIN[:2], "--out", "{tmp}/store", "--data", "{tmp}/store"], 2, "'{tmp}/store' is a data store"),
    ([*TRAIN[:2], "--out", "{tmp}/compact", "--replace", "--data", "{tmp}/store"], 2, "train.safetensors is"),
    (
        ["distillcache", "train", "--out", "{tmp}/policy-x", "--data", "{tmp}/store"],
        2,
        "already holds learned",
    ),
    (["distillcache", "train", "--out", "{tmp}/dcdata", "--data", "{tmp}/store"], 2, "is a data store"),
    (
        ["distillcache", "train", *OUT, "--data", "{tmp}/store", "--interval", "4"],
        2,
        "per-step only (got seq",
    ),
    (["gate", "train", "--out", "{tmp}/compact"], 2, "'{tmp}/compact' already holds learned state"),
    (
        [*RUN, "--data", "{tmp}/surrogate.jsonl", *OUT],
        2,
        "surrogate.jsonl:1: not a JSON line (a \\uD800-\\uDFFF",
    ),
    # memdecay, distillcache: their commands and press arguments
    (["memdecay", "calibrate", *OUT, "--task", "nope"], 2, "unknown task 'nope'"),
    (["memdecay", "calibrate", *OUT, "--samples", "0"], 2, "'--samples': must be at least 1, got 0"),
    (["distillcache", "train", *OUT, "--data", "{tmp}/empty"], 2, "no distillcache data at {tmp}/empty"),
    (
        ["distillcache", "train", *OUT, "--data", "{tmp}/empty", "--steps", "0"],
        2,
        "'--steps': must be at least 1, got 0",
    ),
    (
        ["distillcache", "train", *OUT, "--data", "{tmp}/empty", "--arch", "apple"],
        2,
        "'--arch': 'apple' is not one of",
    ),
    (
        ["distillcache", "train", *OUT, "--data", "{tmp}/empty", "--init", "snapkv"],
        2,
        "'--init': 'snapkv' is not one of",
    ),
    (
        ["distillcache", "train", *OUT, "--data", "{tmp}/kvpdata-x"],
        2,
        "kvpdata-x/manifest.json is a kvp data store, which lacks what distillcache trains on; "
        "make data in another folder with: kvbench distillcache datagen --model x --out DIR",
    ),
    (
        [*TRAIN, "--data", "{tmp}/dcdata"],
        2,
        "dcdata/manifest.json is a distillcache data store, which lacks what kvp trains on; "
        "make data in another folder with: kvbench kvp datagen --model x --out DIR",
    ),
    (
        ["distillcache", "datagen", *OUT, "--mixture", "nope"],
        2,
        "unknown mixture 'nope' (choose one of: ruler",
    ),
    (["distillcache", "datagen", *OUT, "--tasks", "qa_1"], 2, "qa_1 samples do not change with the seed"),
    (["distillcache", "datagen", "--out", "{tmp}/badmanifest"], 2, "badmanifest/manifest.json"),
    (
        [*RUN[:2], "memdecay", "--ratio", "0.5", "--press-arg", "pin=kitchen", *OUT],
        2,
        "unknown region 'kitchen'",
    ),
    # run: names and numbers
    ([*RUN[:2], "nope", "--ratio", "0.5", *OUT], 2, "unknown press 'nope'"),
    ([*RUN[:4], "1.0", *OUT], 2, "ratio must be in [0, 1), got 1.0"),
    ([*RUN[:4], "-0.2", *OUT], 2, "ratio must be in [0, 1), got -0.2"),
    ([*RUN[:4], "half", *OUT], 2, "ratio must be a number in [0, 1), got 'half'"),
    ([*RUN[:4], "nan", *OUT], 2, "got nan"),
    ([*RUN[:4], "inf", *OUT], 2, "got inf"),
    ([*RUN, "--task", "nope", *OUT], 2, "unknown task 'nope'"),
    ([*RUN, "--suite", "nope", *OUT], 2, "unknown suite 'nope'"),
    ([*RUN, "--samples", "0", *OUT], 2, "--samples must be at least 1, got 0"),
    ([*RUN, "--samples", "-3", *OUT], 2, "--samples must be at least 1, got -3"),
    ([*RUN, "--task", "vt", "--length", "100", *OUT], 2, "--length 100 is below the minimum of task 'vt'"),
    ([*RUN, "--length", "0", *OUT], 2, "--length must be at least 1, got 0"),
    ([*RUN, "--length", "-5", *OUT], 2, "--length must be at least 1, got -5"),
    ([*RUN, "--length", "1000000000", *OUT], 2, "--length 1000000000 exceeds the 8192-token context"),
    ([*RUN, "--length", "20000", *OUT], 2, "--length 20000 exceeds the 8192-token context"),
    ([*RUN, "--suite", "longbench", "--length", "9000", *OUT], 2, "--length 9000 exceeds"),
    ([*RUN, "--length", "abc", *OUT], 2, "--length': must be a whole number, got 'abc'"),
    ([*RUN, "--batch-configs", "0", *OUT], 2, "--batch-configs"),
    ([*RUN, "--seed", "x", *OUT], 2, "--seed': must be a whole number, got 'x'"),
    ([*RUN, "--bogus", *OUT], 2, "No such option '--bogus'"),
    ([*RUN[:2], "snapkv", *OUT], 2, "give exactly one of --ratio, --memory or --budget"),
    ([*RUN, "--memory", "0.5", *OUT], 2, "give exactly one of --ratio, --memory or --budget"),
    ([*RUN[:3], "--memory", "0", *OUT], 2, "memory must be in (0, 1]"),
    ([*RUN[:3], "--memory", "1.5", *OUT], 2, "memory must be in (0, 1]"),
    ([*RUN[:3], "--memory", "-0.1", *OUT], 2, "memory must be in (0, 1]"),
    ([*RUN[:3], "--memory", "lots", *OUT], 2, "memory must be a number in (0, 1], got 'lots'"),
    # run: model, device, dtype
    ([*RUN, "--model", "no-such-model", *OUT], 2, "unknown model 'no-such-model'"),
    ([*RUN, "--model", "{tmp}/empty", *OUT], 2, "empty' has no config.json"),
    ([*RUN, "--model", "{tmp}/text.txt", *OUT], 2, "text.txt' is a file"),
    ([*RUN, "--model", "nobody/no-such-model", *OUT], 2, "'nobody/no-such-model' is not in the local"),
    ([*RUN, "--device", "cuda", *OUT], 2, "device 'cuda': CUDA is not available"),
    ([*RUN, "--device", "cuda:7", *OUT], 2, "device 'cuda:7': CUDA is not available"),
    ([*RUN, "--device", "bogus", *OUT], 2, "unknown device 'bogus'"),
    ([*RUN, "--device", "meta", *OUT], 2, "device 'meta' is not supported"),
    ([*RUN, "--dtype", "float8", *OUT], 2, "'float8' is not one of"),
    # run: press arguments
    ([*RUN, "--press-arg", "oops", *OUT], 2, "press argument 'oops' is not key=value"),
    ([*RUN, "--press-arg", "=3", *OUT], 2, "press argument '=3' is not key=value"),
    ([*RUN, "--press-arg", "window_size=abc", *OUT], 2, "window_size='abc' is not int"),
    ([*RUN, "--press-arg", "window_size=[1", *OUT], 2, "press argument 'window_size': cannot read '[1'"),
    # press arguments are typed by one rule (validation.parse_value), not YAML 1.1's: 0x10 and 1:30 are text
    ([*RUN, "--press-arg", "window_size=0x10", *OUT], 2, "window_size='0x10' is not int"),
    ([*RUN, "--press-arg", "window_size=1:30", *OUT], 2, "window_size='1:30' is not int"),
    ([*RUN, "--press-arg", "window_size=5e-1", *OUT], 2, "window_size=0.5 is not int"),
    ([*RUN, "--press-arg", "window_size=1e999", *OUT], 2, "press argument 'window_size' must be a finite"),
    ([*RUN, "--press-arg", "window_size={a: 1}", *OUT], 2, "press argument 'window_size': '{a: 1}' is a"),
    ([*RUN[:2], "random", "--ratio", "0.5", "--press-arg", "seed=yes", *OUT], 2, "seed='yes' is not int"),
    ([*RUN[:2], "quant", "--memory", "0.5", "--press-arg", "memory=2", *OUT], 2, "press argument 'memory'"),
    ([*SWEEP, "--press-arg", "snapkv.memory=2", *OUT], 2, "press argument 'snapkv.memory'"),
    ([*RUN, "--press-arg", "window_size=1.5", *OUT], 2, "window_size=1.5 is not int"),
    ([*RUN, "--press-arg", "window_size=true", *OUT], 2, "window_size=True is not int"),
    ([*RUN, "--press-arg", "bogus=1", *OUT], 2, "press 'snapkv' has no argument 'bogus'"),
    ([*RUN, "--press-arg", "compression_ratio=0.3", *OUT], 2, "compression_ratio"),
    (
        [*RUN[:2], "none", "--ratio", "0", "--press-arg", "x=1", *OUT],
        2,
        "press 'none' takes no press arguments",
    ),
    ([*RUN[:2], "adakv", "--ratio", "0.5", "--press-arg", "inner=nope", *OUT], 2, "inner press 'nope'"),
    ([*RUN[:2], "adakv", "--ratio", "0.5", "--press-arg", "inner=none", *OUT], 2, "inner press 'none'"),
    ([*RUN[:2], "adakv", "--ratio", "0.5", "--press-arg", "inner=3", *OUT], 2, "inner press 3"),
    ([*RUN[:2], "random", "--ratio", "0.5", "--press-arg", "seed=x", *OUT], 2, "seed='x' is not int"),
    ([*RUN[:2], "h2o", "--ratio", "0.5", "--press-arg", "recent_fraction=a", *OUT], 2, "recent_fraction='a'"),
    (
        [*RUN[:2], "kvp", "--ratio", "0.5", "--press-arg", "recent_fraction=1.5", *OUT],
        2,
        "recent_fraction must be in [0, 1], got 1.5",
    ),
    ([*RUN[:2], "quant", "--memory", "0.5", "--press-arg", "bits=x", *OUT], 2, "bits='x'"),
    ([*RUN[:2], "quant", "--memory", "0.01", *OUT], 2, "quant"),
    (
        [*RUN[:2], "kvp", "--ratio", "0.5", "--press-arg", "agents={tmp}/empty", *OUT],
        2,
        "empty (missing card",
    ),
    (
        [*RUN[:2], "kvp", "--ratio", "0.5", "--press-arg", "agents={tmp}/garbage", *OUT],
        2,
        "agents.safetensors",
    ),
    (
        [*RUN[:2], "kvp", "--ratio", "0.5", "--press-arg", "agents={tmp}/badcard", *OUT],
        2,
        "badcard/card.json",
    ),
    (
        [*RUN[:2], "kvp", "--ratio", "0.5", "--press-arg", "agents={tmp}/listcard", *OUT],
        2,
        "listcard/card.json",
    ),
    (
        [
            *RUN[:2],
            "kvp",
            "--ratio",
            "0.5",
            "--press-arg",
            "agents={tmp}/compact",
            "--press-arg",
            "arch=apple",
            *OUT,
        ],
        2,
        "KVP agents at {tmp}/compact are compact agents, not apple",
    ),
    ([*RUN[:2], "kvp", "--ratio", "0.5", "--press-arg", "arch=wide", *OUT], 2, "unknown KVP arch 'wide'"),
    # learned presses: state missing or made for another model, refused before the model loads
    (
        [*RUN[:2], "kvp", "--ratio", "0.5", "--press-arg", "agents={tmp}/compact", *OUT],
        2,
        "KVP agents at {tmp}/compact were made for x, not for smollm2-135m",
    ),
    ([*RUN[:2], "kvp", "--ratio", "0.5", "--model", "{tmp}/model", *OUT], 2, "no KVP agents for {tmp}/model"),
    (
        [*RUN[:2], "distillcache", "--ratio", "0.5", "--press-arg", "weights={tmp}/empty", *OUT],
        2,
        "no distillcache weights at {tmp}/empty (missing card.json)",
    ),
    (
        [*RUN[:2], "distillcache", "--ratio", "0.5", "--press-arg", "weights={tmp}/policy-x", *OUT],
        2,
        "DistillCache weights at {tmp}/policy-x were made for x, not for smollm2-135m",
    ),
    (
        [*RUN[:2], "distillcache", "--ratio", "0.5", "--press-arg", "weights={tmp}/compact", *OUT],
        2,
        "compact/card.json holds kvp weights, not distillcache's",
    ),
    (
        [*SWEEP[:2], "knorm,distillcache", "--ratios", "0.5", "--model", "{tmp}/model", *OUT],
        2,
        "no distillcache weights at",
    ),
    (
        [*RUN[:2], "memdecay", "--ratio", "0.5", "--press-arg", "calibration={tmp}/empty", *OUT],
        2,
        "no MemDecay calibration for smollm2-135m at {tmp}/empty",
    ),
    # run: files and folders
    ([*RUN, "--out", "{tmp}/text.txt/sub"], 2, "text.txt' is a file"),
    ([*RUN, "--out", "{tmp}/text.txt"], 2, "text.txt' is a file"),
    ([*RUN, "--data-dir", "{tmp}/nope", *OUT], 2, "--data-dir '{tmp}/nope' is not a folder"),
    ([*RUN, "--data-dir", "{tmp}/text.txt", *OUT], 2, "--data-dir '{tmp}/text.txt' is not a folder"),
    (
        [*RUN, "--task", "longbench/hotpotqa", "--data-dir", "{tmp}/lb", *OUT],
        2,
        "lb/hotpotqa.jsonl:2: not a JSON",
    ),
    (
        [*RUN, "--task", "longbench/trec", "--data-dir", "{tmp}/lb", *OUT],
        2,
        "lb/trec.jsonl:1: LongBench row lacks length",
    ),
    ([*RUN, "--task", "longbench/samsum", "--data-dir", "{tmp}/lb", *OUT], 2, "lb/samsum.jsonl"),
    (
        [*RUN, "--task", "longbench/musique", "--data-dir", "{tmp}/lb", *OUT],
        2,
        "lb/musique.jsonl:1: not a LongBench row",
    ),
    ([*RUN, "--press-arg", "window_size=abc", "--out", "{tmp}/results"], 2, "window_size='abc'"),
    ([*RUN[:2], "nope", "--ratio", "0.5", "--out", "{tmp}/results"], 2, "unknown press 'nope'"),
    ([*RUN, "--length", "20000", "--out", "{tmp}/results"], 2, "--length 20000 exceeds"),
    # run: protocols
    ([*RUN, "--interval", "4", *OUT], 2, "--interval applies to --protocol decode-time, not query-agnostic"),
    (
        [*RUN, "--protocol", "streaming", "--interval", "4", *OUT],
        2,
        "--interval applies to --protocol decode-time",
    ),
    ([*RUN, "--chunk", "64", *OUT], 2, "--chunk applies to --protocol streaming, not query-agnostic"),
    (
        [*RUN, "--protocol", "decode-time", "--chunk", "64", *OUT],
        2,
        "--chunk applies to --protocol streaming",
    ),
    ([*RUN, "--protocol", "decode-time", "--interval", "0", *OUT], 2, "--interval must be at least 1, got 0"),
    ([*RUN, "--protocol", "streaming", "--chunk", "-3", *OUT], 2, "--chunk must be at least 1, got -3"),
    ([*RUN, "--protocol", "streaming", "--chunk", "x", *OUT], 2, "--chunk': must be a whole number, got 'x'"),
    ([*RUN, "--protocol", "sideways", *OUT], 2, "'sideways' is not one of"),
    (
        [*RUN[:2], "adakv", "--ratio", "0.5", "--protocol", "streaming", *OUT],
        2,
        "cannot run under the streaming",
    ),
    (
        [*RUN[:2], "lowrank", "--memory", "0.5", "--protocol", "decode-time", *OUT],
        2,
        "LowRankPress compresses the context once: it cannot compress the cache again as it grows",
    ),
    # run: absolute budgets
    ([*RUN, "--budget", "64", *OUT], 2, "give exactly one of --ratio, --memory or --budget"),
    ([*RUN[:3], "--budget", "0", *OUT], 2, "budget must be at least 1 KV entry per head, got 0"),
    ([*RUN[:3], "--budget", "12.5", *OUT], 2, "budget must be a whole number of KV entries per head"),
    ([*RUN[:3], "--budget", "1024", *OUT], 2, "--budget 1024 is not below the 512-token context of task"),
    ([*RUN[:2], "quant", "--budget", "64", *OUT], 2, "is a codec: it stores every entry in fewer bits"),
    ([*SWEEP[:3], "--budget", "64,-1", *OUT], 2, "budget must be at least 1 KV entry per head, got -1"),
    ([*SWEEP[:3], "--budget", "64,64", *OUT], 2, "duplicate configs"),
    # run: questions and turns
    ([*RUN, "--questions", "2", *OUT], 2, "--questions applies to --protocol multi-question"),
    ([*RUN, "--protocol", "multi-turn", "--questions", "2", *OUT], 2, "--questions applies to --protocol"),
    ([*RUN, "--protocol", "multi-question", "--questions", "0", *OUT], 2, "--questions must be at least 1"),
    (
        [*RUN, "--protocol", "multi-question", "--task", "heldout_story_place", "--length", "4096", *OUT],
        2,
        "task 'heldout_story_place' in one context would make its questions ambiguous (its question asks "
        "about the one line of its kind)",
    ),
    (
        [*RUN, "--protocol", "multi-turn", "--turns", "3", "--task", "cwe", "--length", "4096", *OUT],
        2,
        "3 turns per context from 1 task(s): two samples of task 'cwe' in one context would make its "
        "questions ambiguous (its question is about the whole context)",
    ),
    (
        [*RUN, "--protocol", "multi-question", "--suite", "heldout", "--length", "1024", *OUT],
        2,
        "gives each of 4 questions 256 tokens, below the minimum of task",
    ),
    (
        [*RUN, "--protocol", "multi-turn", "--task", "niah_single_1", "--length", "4096", *OUT],
        2,
        "press 'snapkv' scores with its last 64 queries, but a multi-turn step feeds as few as 8 tokens",
    ),
    (
        [*RUN, "--protocol", "decode-time", *OUT],
        2,
        "scores with its last 64 queries, but a decode-time step feeds 16 tokens",
    ),
    (
        [*RUN[:2], "kvzip", "--ratio", "0.5", "--protocol", "multi-turn", "--length", "4096", *OUT],
        2,
        "cannot run under the multi-turn",
    ),
    (
        [*RUN[:2], "adakv", "--ratio", "0.5", "--protocol", "multi-question", "--length", "4096", *OUT],
        2,
        "cannot run under the multi-question protocol",
    ),
    (
        [*RUN, "--protocol", "multi-question", "--task", "longbench/qasper", "--task", "vt", *OUT],
        2,
        "LongBench task 'longbench/qasper' cannot share contexts with tasks of other families",
    ),
    (
        [*RUN[:2], "knorm", "--ratio", "0.5", "--protocol", "multi-turn", "--task", "longbench/trec", *OUT],
        2,
        "task 'longbench/trec' is a raw prompt without the chat template: it has no turns to take",
    ),
    # sweep
    (["sweep", "--presses", "", "--ratios", "0.5", *OUT], 2, "must each name at least one value"),
    (["sweep", "--presses", "snapkv,snapkv", "--ratios", "0.5", *OUT], 2, "duplicate configs"),
    ([*SWEEP[:4], "0.5,0.5", *OUT], 2, "duplicate configs"),
    ([*SWEEP[:4], "-0,0", *OUT], 2, "duplicate configs"),  # -0 is 0
    ([*SWEEP[:4], "0.5,1.5", *OUT], 2, "ratio must be in [0, 1), got 1.5"),
    ([*SWEEP[:4], "0.5,x", *OUT], 2, "ratio must be a number in [0, 1), got 'x'"),
    ([*SWEEP[:3], "--memory", "0.5,2", *OUT], 2, "memory must be in (0, 1]"),
    ([*SWEEP, "--memory", "0.5", *OUT], 2, "give exactly one of --ratios, --memory or --budget"),
    ([*SWEEP[:3], *OUT], 2, "give exactly one of --ratios, --memory or --budget"),
    ([*SWEEP[:3], "--memory", "0.5,0.5", *OUT], 2, "duplicate configs"),
    (["sweep", "--presses", "snapkv,nope", "--ratios", "0.5", *OUT], 2, "unknown press 'nope'"),
    (
        ["sweep", "--presses", "knorm,think", "--ratios", "0.5", "--protocol", "decode-time", *OUT],
        2,
        "'think'",
    ),
    ([*SWEEP, "--length", "20000", *OUT], 2, "--length 20000 exceeds"),
    ([*SWEEP, "--press-arg", "bogus=1", *OUT], 2, "press 'snapkv' has no argument 'bogus'"),
    (
        [*SWEEP[:2], "knorm,kvp", *SWEEP[3:], "--press-arg", "agents={tmp}/compact", *OUT],
        2,
        "no argument 'agents'",
    ),
    ([*SWEEP, "--device", "bogus", *OUT], 2, "unknown device 'bogus'"),
    ([*SWEEP, "--suite", "nope", *OUT], 2, "unknown suite 'nope'"),
    ([*SWEEP, "--model", "{tmp}/empty", *OUT], 2, "has no config.json"),
    # sweep --ray (the cluster's own refusals: tests/harness/test_ray_sweep.py)
    ([*SWEEP, "--ray", "--ray-workers", "0", *OUT], 2, "'--ray-workers': must be at least 1, got 0"),
    ([*SWEEP, "--ray", "--ray-gpus", "-1", *OUT], 2, "'--ray-gpus': must be >= 0, got -1"),
    ([*SWEEP, "--ray-gpus", "1", *OUT], 2, "--ray-gpus applies to a sweep with --ray"),
    ([*SWEEP, "--ray", "127.0.0.1:1", *OUT], 2, "cannot reach the Ray cluster at 127.0.0.1:1"),
    ([*RUN, "--ray", *OUT], 2, "No such option '--ray'"),
    # perplexity
    ([*PPL, "--budget", "0", *OUT], 2, "budget must be at least 1 KV entry per head, got 0"),
    ([*PPL, "--budget", "lots", *OUT], 2, "budget must be a whole number of KV entries per head, got 'lots'"),
    (
        [*PPL, "--budget", "64", "--every", "0", *OUT],
        2,
        "--every must be a whole number of at least 1, got 0",
    ),
    # a budget no prediction is made under: the cache never holds more before one
    ([*PPL, "--budget", "4096", "--length", "2048", *OUT], 2, "budget 4096: at --length 2048 and --every 16"),
    (
        [*PPL, "--budget", "2032", "--length", "2048", *OUT],
        2,
        "holds at most 2032 entries before a prediction",
    ),
    ([*PPL, "--budget", "32", "--length", "64", "--every", "64", *OUT], 2, "--every 64 feeds the 64-token"),
    ([*PPL, "--budget", "32", "--length", "64", "--every", "32", *OUT], 2, "holds at most 32 entries"),
    ([*PPL, "--budget", "64", "--ratios", "0.5", *OUT], 2, "give one of --ratios, --memory or --budget"),
    ([*PPL, *OUT], 2, "give one of --ratios, --memory or --budget"),
    ([*PPL, "--budget", "64,64", *OUT], 2, "duplicate configs"),
    (
        [*PPL[:2], "adakv", "--budget", "64", *OUT],
        2,
        "press 'adakv' cannot run under the perplexity protocol",
    ),
    ([*PPL[:2], "nope", "--budget", "64", *OUT], 2, "unknown press 'nope'"),
    ([*PPL[:2], "snapkv", "--budget", "64", *OUT], 2, "its last 64 queries, but a perplexity step feeds 16"),
    ([*PPL, "--budget", "64", "--source", "poetry", *OUT], 2, "unknown text source 'poetry'"),
    ([*PPL, "--budget", "64", "--source", ",", *OUT], 2, "--source must name at least one of"),
    ([*PPL, "--budget", "64", "--texts", "0", *OUT], 2, "--texts': must be at least 1, got 0"),
    ([*PPL, "--budget", "64", "--span", "0", *OUT], 2, "--span must be a whole number of at least 1"),
    ([*PPL, "--budget", "64", "--length", "20000", *OUT], 2, "--length 20000 exceeds the 8192-token context"),
    (
        [*PPL, "--budget", "64", "--data-dir", "{tmp}/nope", *OUT],
        2,
        "--data-dir '{tmp}/nope' is not a folder",
    ),
    ([*PPL, "--budget", "64", "--data-dir", "{tmp}/empty", *OUT], 2, "empty' holds no .txt or .jsonl file"),
    ([*PPL, "--budget", "64", "--data-dir", "{tmp}/blank", *OUT], 2, "blank' holds no text"),
    ([*PPL, "--budget", "64", "--data-dir", "{tmp}/shorttext", *OUT], 2, "(the longest has 4)"),
    (
        [*PPL, "--budget", "64", "--data-dir", "{tmp}/badtext", *OUT],
        2,
        'b.jsonl:2: not a JSON object with a "text"',
    ),
    ([*PPL, "--budget", "64", "--out", "{tmp}/text.txt"], 2, "text.txt' is a file"),
    ([*PPL, "--budget", "64", "--device", "bogus", *OUT], 2, "unknown device 'bogus'"),
    # presses, tasks, unknown commands
    (["presses", "extra"], 2, "unexpected extra argument (extra)"),
    (["presses", "--bogus"], 2, "No such option '--bogus'"),
    (["tasks", "extra"], 2, "unexpected extra argument (extra)"),
    (["tasks", "--bogus"], 2, "No such option '--bogus'"),
    (["nope"], 2, "No such command 'nope'"),
    # report
    (["report", "{tmp}/nope", *OUT], 2, "no results at '{tmp}/nope': no such file or folder"),
    (
        ["export", "--format", "kvpress", "{tmp}/nope", "{tmp}/x"],
        2,
        "no results at '{tmp}/nope': no such file",
    ),
    (["report", "{tmp}/empty", *OUT], 2, "empty holds no results"),
    (["report", "{tmp}/garbage", *OUT], 2, "garbage/rows.jsonl"),
    (["report", *OUT], 2, "Missing argument 'RESULT_DIRS"),
    (
        ["report", "{tmp}/scored", *OUT, "--versus", "nope"],
        2,
        "--versus 'nope' is not a press of these results",
    ),
    (
        ["report", "{tmp}/scored", *OUT, "--presses", "nope"],
        2,
        "--presses 'nope' is not a press of these results",
    ),
    (
        ["report", "{tmp}/scored", *OUT, "--every-state", "--versus", "kvp@nope"],
        2,
        "--versus 'kvp@nope' is not a press of these results",
    ),
    # kvp datagen, train, report
    ([*DATAGEN, "--length", "10"], 2, "10 is below the minimum of task 'niah_single_1'"),
    ([*DATAGEN, "--length", "20000"], 2, "20000 exceeds the 8192-token context"),
    ([*DATAGEN, "--tasks", "nope"], 2, "'nope' is not a task"),
    ([*DATAGEN, "--tasks", ","], 2, "name at least one task"),
    ([*DATAGEN, "--samples", "4"], 2, "--val-fraction 0.1 of 4 samples makes no validation prompt"),
    (
        [*DATAGEN, "--tasks", "longbench/hotpotqa"],
        2,
        "longbench/hotpotqa samples do not change with the seed",
    ),
    ([*DATAGEN, "--tasks", "agent_system_fact", "--length", "512"], 2, "512 is below the minimum"),
    ([*DATAGEN, "--mixture", "nope"], 2, "unknown mixture 'nope' (choose one of: ruler"),
    ([*DATAGEN, "--mixture", "ruler", "--length", "512"], 2, "--mixture ruler sets the tasks, lengths"),
    ([*DATAGEN, "--mixture", "ruler", "--tasks", "vt", "--samples", "3"], 2, "drop --tasks, --samples"),
    ([*DATAGEN, "--tasks", "qa_1"], 2, "qa_1 samples do not change with the seed"),
    ([*DATAGEN, "--seed", "5"], 2, "--seed"),
    ([*DATAGEN, "--target", "authors", "--seed", "5"], 2, "--seed"),
    ([*DATAGEN, "--target", "authors", "--reconstruction"], 2, "scores the context of --target kvbench"),
    ([*DATAGEN, "--target", "paper"], 2, "'paper' is not one of 'kvbench', 'authors'"),
    ([*DATAGEN, "--samples", "0"], 2, "--samples"),
    ([*DATAGEN, "--val-fraction", "1.5"], 2, "--val-fraction"),
    ([*DATAGEN, "--device", "bogus"], 2, "unknown device 'bogus'"),
    ([*DATAGEN, "--model", "{tmp}/empty"], 2, "has no config.json"),
    (["kvp", "datagen", "--out", "{tmp}/text.txt"], 2, "text.txt"),
    (["kvp", "datagen", "--out", "{tmp}/badmanifest"], 2, "badmanifest/manifest.json"),
    ([*TRAIN, "--data", "{tmp}/empty"], 2, "no kvp data at {tmp}/empty (missing manifest.json)"),
    (
        [*TRAIN, "--data", "{tmp}/empty", "--budget-weights", "top"],
        2,
        "'--budget-weights': 'top' is not one of",
    ),
    ([*TRAIN, "--data", "{tmp}/badmanifest"], 2, "badmanifest/manifest.json is corrupt"),
    ([*TRAIN, "--data", "{tmp}/empty", "--utility", "kl"], 2, "'--utility': 'kl' is not one of"),
    (
        [*TRAIN, "--data", "{tmp}/kvpdata-future", "--utility", "reconstruction"],
        2,
        "{tmp}/kvpdata-future holds no reconstruction scores, which --utility reconstruction trains on",
    ),
    (
        [*TRAIN, "--data", "{tmp}/nomodel"],
        2,
        "nomodel/manifest.json is corrupt (field 'model': field required; 1 more bad field)",
    ),
    (
        [*TRAIN, "--data", "{tmp}/kvpdata-x", "--data", "{tmp}/kvpdata-y"],
        2,
        "KVP data folders made for different models: {tmp}/kvpdata-x (x), {tmp}/kvpdata-y (y)",
    ),
    ([*TRAIN, "--data", "{tmp}/empty", "--layers", "a,b"], 2, "expected comma-separated integers, got 'a,b'"),
    ([*TRAIN, "--data", "{tmp}/empty", "--steps", "0"], 2, "--steps"),
    ([*TRAIN, "--data", "{tmp}/empty", "--arch", "wide"], 2, "'wide' is not one of 'compact', 'apple'"),
    ([*TRAIN, "--data", "{tmp}/empty", "--rankings", "1"], 2, "--rankings 1 leaves no other ranking"),
    (
        [*TRAIN, "--data", "{tmp}/empty", "--recipe", "authors", "--prompts", "1"],
        2,
        "--baseline batch needs two rankings a step or more",
    ),
    ([*TRAIN, "--data", "{tmp}/empty", "--position-rows", "64"], 2, "it needs --arch apple"),
    ([*TRAIN, "--data", "{tmp}/empty", "--recipe", "paper"], 2, "'paper' is not one of 'kvbench', 'authors'"),
    ([*TRAIN, "--data", "{tmp}/empty", "--tokens", "1"], 2, "--tokens"),
    (["kvp", "report", "{tmp}/empty"], 2, "no KVP agents at {tmp}/empty (missing card.json)"),
    (
        ["kvp", "report", "{tmp}/empty", "--utility", "reconstruction"],
        2,
        "Invalid value for --utility: scores against another target need --data",
    ),
    (["kvp", "report", "{tmp}/badcard"], 2, "badcard/card.json: not a KVP agents card"),
    (["kvp", "report", "{tmp}/listcard"], 2, "listcard/card.json: not a KVP agents card"),
    (["kvp", "report", "{tmp}/extracard"], 2, "card.json: not a KVP agents card (field 'model.vocab'"),
    (["kvp", "report", "{tmp}/headscard"], 2, "headscard/card.json: not a KVP agents card (field 'heads'"),
    (["kvp", "report", "{tmp}/valcard"], 2, "valcard/card.json: not a KVP agents card (a validation list"),
    (["kvp", "report", "{tmp}/deepcard"], 2, "deepcard/card.json: not a KVP agents card"),
    (["kvp", "report", "{tmp}/compact", "--data", "{tmp}/empty"], 2, "no kvp data at {tmp}/empty"),
    (["kvp", "report", "{tmp}/compact", "--data", "{tmp}/nope"], 2, "no kvp data at {tmp}/nope"),
    (["kvp", "nope"], 2, "No such command 'nope'"),
    # numbers: nan and inf refused wherever a float is read (kvbench.core.validation)
    ([*RUN[:3], "--memory", "nan", *OUT], 2, "memory must be a finite number in (0, 1], got nan"),
    ([*RUN[:3], "--memory", "inf", *OUT], 2, "got inf"),
    ([*SWEEP[:4], "0.5,nan", *OUT], 2, "got nan"),
    ([*SWEEP, "--ray", "--ray-gpus", "nan", *OUT], 2, "'--ray-gpus': must be a finite number >= 0, got nan"),
    ([*LM_EVAL[:4], "nan", *LM_EVAL[5:], *OUT], 2, "ratio must be a finite number in [0, 1), got nan"),
    ([*TRAIN, "--data", "{tmp}/empty", "--lr", "nan"], 2, "'--lr': must be a finite number > 0, got nan"),
    ([*TRAIN, "--data", "{tmp}/empty", "--lr", "inf"], 2, "'--lr': must be a finite number > 0, got inf"),
    ([*DATAGEN, "--val-fraction", "nan"], 2, "'--val-fraction': must be a finite number in [0, 1)"),
    (["distillcache", "train", *OUT, "--data", "{tmp}/empty", "--lr", "nan"], 2, "'--lr': must be a finite"),
    (["distillcache", "train", *OUT, "--data", "{tmp}/empty", "--entropy-bonus", "inf"], 2, "got inf"),
    (["distillcache", "train", *OUT, "--data", "{tmp}/empty", "--ratios", "0.5,nan"], 2, "got nan"),
    (["memdecay", "calibrate", *OUT, "--threshold", "nan"], 2, "'--threshold': must be a finite number > 0"),
    ([*RUN, "--press-arg", "window_size=.nan", *OUT], 2, "press argument 'window_size' must be a finite"),
    ([*RUN[:2], "h2o", "--ratio", "0.5", "--press-arg", "recent_fraction=.inf", *OUT], 2, "a finite"),
    # duplicates: refused in one line, or normalised
    ([*SWEEP[:3], "--memory", "0.5,0.50000000000001", *OUT], 2, "duplicate configs"),
    ([*SWEEP[:4], "1e-320,0", *OUT], 2, "duplicate configs"),
    ([*RUN, "--press-arg", "window_size=32", "--press-arg", "window_size=16", *OUT], 2, "given twice"),
    ([*SWEEP, "--press-arg", "window_size=32", "--press-arg", "window_size=32", *OUT], 2, "given twice"),
    ([*RUN[:2], "none", "--ratio", "0.5", *OUT], 2, "press 'none' compresses nothing: its --ratio must be 0"),
    ([*RUN[:2], "none", "--memory", "0.5", *OUT], 2, "press 'none' compresses nothing"),
    ([*TRAIN, "--data", "{tmp}/empty", "--layers", "0,0"], 2, "an index is given twice in '0,0'"),
    (["distillcache", "train", *OUT, "--data", "{tmp}/empty", "--ratios", "0.5,0.5"], 2, "given twice"),
    # press arguments that build a press and break its prefill: tried on a tiny model before any write
    ([*RUN, "--press-arg", "window_size=0", *OUT], 2, "press 'snapkv' fails with window_size=0"),
    ([*RUN, "--press-arg", "window_size=-5", *OUT], 2, "press 'snapkv' fails with window_size=-5"),
    ([*RUN[:2], "random", *RUN[3:], "--press-arg", "seed=" + "9" * 30, *OUT], 2, "'seed' must be at most"),
    ([*RUN[:2], "adakv", *RUN[3:], "--press-arg", "inner=adakv", *OUT], 2, "requires a ScorerPress"),
    ([*RUN[:2], "adakv", *RUN[3:], "--press-arg", "inner=quant", *OUT], 2, "requires a ScorerPress"),
    ([*RUN[:2], "chunkkv", *RUN[3:], "--press-arg", "chunk_length=0", *OUT], 2, "fails with chunk_length=0"),
    ([*SWEEP, "--press-arg", "window_size=0", *OUT], 2, "press 'snapkv' fails with window_size=0"),
    ([*LM_EVAL, "--press-arg", "window_size=0", *OUT], 2, "press 'snapkv' fails with window_size=0"),
    ([*RUN, "--press-arg", "window_size=0", "--out", "{tmp}/results"], 2, "fails with window_size=0"),
    # the Python API's numbers, through the command line's types they share
    ([*RUN, "--seed", "9" * 30, *OUT], 2, "--seed': must be at most 9223372036854775807"),
    # commands check --out, --device and the model before they measure or train
    (["memdecay", "calibrate", "--out", "{tmp}/text.txt/sub"], 2, "text.txt' is a file"),
    (["memdecay", "calibrate", *OUT, "--device", "bogus"], 2, "unknown device 'bogus'"),
    (["memdecay", "calibrate", *OUT, "--model", "{tmp}/empty"], 2, "has no config.json"),
    (["distillcache", "train", "--out", "{tmp}/text.txt/sub", "--data", "{tmp}/store"], 2, "is a file"),
    (["distillcache", "train", *OUT, "--data", "{tmp}/store", "--device", "bogus"], 2, "unknown device"),
    (["kvp", "report", "{tmp}/compact", "--plot", "{tmp}/text.txt/p.png"], 2, "text.txt' is not a folder"),
    (["kvp", "report", "{tmp}/compact", "--plot", "{tmp}/empty"], 2, "empty' is a directory"),
    (["kvp", "report", "{tmp}/compact", "--plot", "/proc/kvbench.png"], 2, "--plot folder '/proc'"),
    (["report", "{tmp}/scored", "--out", "/proc/kvbench-report"], 2, "--out folder '/proc/kvbench-report'"),
    (["report", "{tmp}/scored", "--out", "/dev/full"], 2, "'/dev/full' is a file"),
    (["report", "{tmp}/scored", "--out", "{tmp}/scored"], 2, "scored' is a results folder: give the report"),
    (["report", "{tmp}/scored", "--out", "{tmp}/text.txt/sub"], 2, "text.txt' is a file"),
    # results folders that pass a first look and fail at the first write (or hang on a FIFO)
    ([*RUN, "--out", "{tmp}/rowsdir"], 2, "rowsdir/rows.jsonl' is not a plain file"),
    ([*RUN, "--out", "{tmp}/rowsfifo"], 2, "rowsfifo/rows.jsonl' is not a plain file"),
    ([*RUN, "--out", "{tmp}/lockdir"], 2, "lockdir/rows.jsonl.lock' is not a plain file"),
    ([*RUN, "--out", "{tmp}/lockfifo"], 2, "lockfifo/rows.jsonl.lock' is not a plain file"),
    ([*RUN, "--out", "{tmp}/runsfile"], 2, "runsfile/runs' is not a folder"),
    ([*RUN, "--out", "{tmp}/dangling"], 2, "dangling' is a dangling link"),
    ([*RUN, "--out", "{tmp}/rowslink"], 2, "rowslink/rows.jsonl' is a dangling link"),
    ([*RUN, "--out", "{tmp}/" + "x" * 300], 2, "is not writable: File name too long"),
    ([*RUN, "--out", "/proc/kvbench-results"], 2, "results folder '/proc/kvbench-results' is not writable"),
    ([*LM_EVAL, "--out", "{tmp}/rowsfifo"], 2, "rowsfifo/rows.jsonl' is not a plain file"),
    # local task data checked for types, not only for presence
    (
        [*RUN, "--task", "longbench/qasper", "--data-dir", "{tmp}/lb", *OUT],
        2,
        "qasper.jsonl:1: field 'answers'",
    ),
    ([*RUN, "--task", "longbench/narrativeqa", "--data-dir", "{tmp}/lb", *OUT], 2, "narrativeqa.jsonl:1"),
    (
        [*RUN, "--task", "longbench/lcc", "--data-dir", "{tmp}/lb", *OUT],
        2,
        "lcc.jsonl: holds no LongBench rows",
    ),
    ([*RUN, "--task", "longbench/gov_report", "--data-dir", "{tmp}/lb", *OUT], 2, "is also the id of line 1"),
    ([*RUN, "--task", "longbench/qmsum", "--data-dir", "{tmp}/lb", *OUT], 2, "qmsum.jsonl:1: field '_id'"),
    (
        [*RUN, "--task", "qa_1", "--data-dir", "{tmp}/qa", *OUT],
        2,
        "dev-v2.0.json: field 'data.0.paragraphs.0",
    ),
    ([*RUN, "--task", "qa_2", "--data-dir", "{tmp}/qa", *OUT], 2, "hotpot_dev_distractor_v1.json: field '0"),
    # training stores: manifests and shards
    (
        [*TRAIN, "--data", "{tmp}/manifest-split"],
        2,
        "manifest-split/manifest.json is corrupt (field 'shards.0.split'",
    ),
    ([*TRAIN, "--data", "{tmp}/manifest-tokens"], 2, "is corrupt (field 'shards.0.prompt_tokens'"),
    ([*TRAIN, "--data", "{tmp}/manifest-path"], 2, "shard file '../x.safetensors' is not a file name"),
    ([*TRAIN, "--data", "{tmp}/manifest-layers"], 2, "is corrupt (field 'model.num_layers'"),
    ([*TRAIN, "--data", "{tmp}/manifest-config"], 2, "is corrupt (field 'config'"),
    ([*TRAIN, "--data", "{tmp}/manifest-shards"], 2, "is corrupt (field 'shards'"),
    ([*TRAIN, "--data", "{tmp}/manifest-twice"], 2, "a shard is listed twice"),
    ([*TRAIN, "--data", "{tmp}/store"], 2, "store/train.safetensors is unreadable"),
    (["distillcache", "datagen", "--out", "{tmp}/manifest-split"], 2, "not a datagen manifest"),
    # a MemDecay calibration that does not fit its schema
    (
        [*RUN[:2], "memdecay", "--ratio", "0.5", "--press-arg", "calibration={tmp}/nancal", *OUT],
        2,
        "nancal/calibration.json is corrupt (field 'threshold'",
    ),
    (
        [*RUN[:2], "memdecay", "--ratio", "0.5", "--press-arg", "calibration={tmp}/regioncal", *OUT],
        2,
        "regioncal/calibration.json is corrupt (no region tool, scratchpad)",
    ),
    # Ray addresses
    ([*SWEEP, "--ray", "", *OUT], 2, "--ray '' is not a Ray address"),
    (
        [*SWEEP, "--ray", "http://127.0.0.1:8265", *OUT],
        2,
        "--ray 'http://127.0.0.1:8265' is not a Ray address",
    ),
    ([*SWEEP, "--ray", "head node", *OUT], 2, "is not a Ray address"),
    # lm-eval
    (["lm-eval", "--press", "nope", *LM_EVAL[3:], *OUT], 2, "unknown press 'nope'"),
    ([*LM_EVAL[:4], "1.5", *LM_EVAL[5:], *OUT], 2, "ratio must be in [0, 1), got 1.5"),
    ([*LM_EVAL[:4], "x", *LM_EVAL[5:], *OUT], 2, "ratio must be a number in [0, 1), got 'x'"),
    (
        [*LM_EVAL, "--length", "10", *OUT],
        2,
        "--length 10 is below the minimum of task 'kvbench_niah_single_1'",
    ),
    ([*LM_EVAL, "--length", "1000000000", *OUT], 2, "--length 1000000000 exceeds the 8192-token context"),
    ([*LM_EVAL, "--device", "bogus", *OUT], 2, "unknown device 'bogus'"),
    ([*LM_EVAL, "--device", "cuda", *OUT], 2, "CUDA is not available"),
    ([*LM_EVAL, "--model", "{tmp}/empty", *OUT], 2, "has no config.json"),
    ([*LM_EVAL, "--press-arg", "window_size=abc", *OUT], 2, "window_size='abc' is not int"),
    (["lm-eval", "--press", "none", *LM_EVAL[3:], "--press-arg", "x=1", *OUT], 2, "takes no press arguments"),
    ([*LM_EVAL[:5], "--tasks", ",", *OUT], 2, "--tasks must name at least one task"),
    ([*LM_EVAL, "--out", "{tmp}/text.txt/sub"], 2, "text.txt' is a file"),
    ([*LM_EVAL, "--limit", "0", *OUT], 2, "--limit"),
    (
        [*LM_EVAL[:2], "kvp", *LM_EVAL[3:], "--press-arg", "agents={tmp}/compact", *OUT],
        2,
        "KVP agents at {tmp}/compact were made for x, not for smollm2-135m",
    ),
    (
        [*LM_EVAL[:5], "--tasks", "no_such_lm_eval_task", *OUT],
        2,
        "unknown lm-eval task 'no_such_lm_eval_task'",
    ),
]


def make_files(tmp: Path) -> None:
    """The bad files and folders the table points at, and a results folder that must stay untouched."""
    (tmp / "empty").mkdir()
    (tmp / "text.txt").write_text("not a model\n")
    (tmp / "surrogate.jsonl").write_text(
        '{"context": "abc \\ud800 def", "question": "q?", "answers": ["a"]}\n'
    )
    (tmp / "mine.jsonl").write_text(
        json.dumps({"context": "c " * 40, "question": "q?", "answers": ["a"]}) + "\n"
    )
    shape = {"name": "x", "num_layers": 1, "num_kv_heads": 1, "head_dim": 4}
    for name, card in (
        ("garbage", json.dumps({"model": shape, "heads": [0]})),
        ("badcard", "{oops"),
        ("listcard", "[1, 2]"),
        ("extracard", json.dumps({"model": {**shape, "vocab": 9}, "heads": [0]})),
        ("headscard", json.dumps({"model": shape, "heads": "0"})),
        ("valcard", json.dumps({"model": shape, "heads": [0], "validation": {"agent": [1.0, 2.0]}})),
        (
            "deepcard",
            json.dumps({"model": shape, "heads": [0]})[:-1] + ', "agent": ' + "[" * 5000 + "]" * 5000 + "}",
        ),
    ):
        (tmp / name).mkdir()
        (tmp / name / "card.json").write_text(card)
        (tmp / name / "agents.safetensors").write_bytes(b"\x00garbage" * 8)
    (tmp / "garbage" / "rows.jsonl").write_text("".join(f"garbage line {i}\n" for i in range(100)))
    save_agents(tmp / "compact", KVPAgents(1, 4, hidden=2), {"model": shape, "heads": [0]})
    (tmp / "policy-x").mkdir()  # a DistillCache card for model "x"
    (tmp / "policy-x" / "card.json").write_text(json.dumps({"method": "distillcache", "model": shape}))
    (tmp / "model").mkdir()  # a model folder (config only) no learned press has state for
    (tmp / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp / "badmanifest").mkdir()
    (tmp / "badmanifest" / "manifest.json").write_text("{oops")
    (tmp / "nomodel").mkdir()
    (tmp / "nomodel" / "manifest.json").write_text('{"shards": []}')
    (tmp / "dcdata").mkdir()  # a data store DistillCache's datagen made before the shared one
    store = {"method": "distillcache", "model": shape, "config": {}, "shards": []}
    (tmp / "dcdata" / "manifest.json").write_text(json.dumps(store))
    for name in ("x", "y"):  # two well-formed KVP data stores made for two different models
        (tmp / f"kvpdata-{name}").mkdir()
        store = {"method": "kvp", "model": {**shape, "name": name}, "config": {}, "shards": []}
        (tmp / f"kvpdata-{name}" / "manifest.json").write_text(json.dumps(store))
    (tmp / "kvpdata-future").mkdir()  # made without --reconstruction: future attention only
    shards = [
        {"file": f"{split}.safetensors", "split": split, "prompt_tokens": 8} for split in ("train", "val")
    ]
    store = {"method": "shared", "model": shape, "config": {"reconstruction": False}, "shards": shards}
    (tmp / "kvpdata-future" / "manifest.json").write_text(json.dumps(store))
    (tmp / "lb").mkdir()
    good = {"input": "Who?", "context": "Alice.", "answers": ["Alice"], "length": 2, "_id": "a"}
    (tmp / "lb" / "hotpotqa.jsonl").write_text(json.dumps(good) + "\n{not json\n")
    (tmp / "lb" / "trec.jsonl").write_text(
        json.dumps({k: v for k, v in good.items() if k != "length"}) + "\n"
    )
    (tmp / "lb" / "musique.jsonl").write_text("[1, 2]\n")
    for name, files in (  # local texts for `kvbench perplexity` that hold none it can read
        ("blank", {"a.txt": "  \n", "b.jsonl": json.dumps({"text": " "}) + "\n\n"}),
        ("shorttext", {"a.txt": "A short text."}),
        ("badtext", {"b.jsonl": json.dumps({"text": ""}) + "\n" + json.dumps({"body": "x"}) + "\n"}),
    ):
        (tmp / name).mkdir()
        for file, content in files.items():
            (tmp / name / file).write_text(content)
    with ResultsStore(tmp / "scored") as store:  # one well-formed row
        store.append(Row("c", "m", "knorm", 0.5, "t", 1024, 0, "s0", content_hash="h", score=1.0))
    (tmp / "results").mkdir()
    (tmp / "results" / "rows.jsonl").write_text(
        json.dumps({"config_id": "c", "task": "t", "score": 1}) + "\n"
    )
    make_bad_folders(tmp)
    make_bad_data(tmp, good, shape)


def make_bad_folders(tmp: Path) -> None:
    """Results folders whose files are not what the store opens: a folder, a FIFO, dangling links."""
    for name, entry, kind in (
        ("rowsdir", "rows.jsonl", "dir"),
        ("rowsfifo", "rows.jsonl", "fifo"),
        ("lockdir", "rows.jsonl.lock", "dir"),
        ("lockfifo", "rows.jsonl.lock", "fifo"),
        ("runsfile", "runs", "file"),
        ("rowslink", "rows.jsonl", "link"),
    ):
        (tmp / name).mkdir()
        path = tmp / name / entry
        if kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "file":
            path.write_text("")
        else:
            path.symlink_to(tmp / "nowhere")
    (tmp / "dangling").symlink_to(tmp / "nowhere")


def make_bad_data(tmp: Path, good: dict, shape: dict) -> None:
    """Local task data, data stores and calibrations of the right shape with fields of the wrong type."""
    lines = {
        "qasper": [{**good, "answers": "Alice"}],  # scored letter by letter if read
        "narrativeqa": [{**good, "length": float("nan")}],
        "lcc": [],
        "gov_report": [good, {**good, "input": "Who else?"}],
        "qmsum": [{**good, "_id": ["a"]}],
    }
    for name, rows in lines.items():
        (tmp / "lb" / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp / "qa").mkdir()
    squad = {"data": [{"paragraphs": [{"context": 1, "qas": []}]}]}
    (tmp / "qa" / "dev-v2.0.json").write_text(json.dumps(squad))
    (tmp / "qa" / "hotpot_dev_distractor_v1.json").write_text(json.dumps([{"question": "q", "answer": 5}]))
    shard = {"file": "train.safetensors", "split": "train", "prompt_tokens": 8}
    valid = {
        "method": "shared",
        "model": shape,
        "config": {},
        "shards": [shard, {**shard, "file": "val.safetensors", "split": "val"}],
    }
    stores = {
        "store": valid,  # well-formed, its shards garbage
        "manifest-split": {**valid, "shards": [{**shard, "split": "test"}]},
        "manifest-tokens": {**valid, "shards": [{**shard, "prompt_tokens": "8"}]},
        "manifest-path": {**valid, "shards": [{**shard, "file": "../x.safetensors"}]},
        "manifest-layers": {**valid, "model": {**shape, "num_layers": -1}},
        "manifest-config": {**valid, "config": [1]},
        "manifest-shards": {**valid, "shards": {"file": "train.safetensors"}},
        "manifest-twice": {**valid, "shards": [shard, shard]},
    }
    for name, manifest in stores.items():
        (tmp / name).mkdir()
        (tmp / name / "manifest.json").write_text(json.dumps(manifest))
    for split in ("train", "val"):
        (tmp / "store" / f"{split}.safetensors").write_bytes(b"\x00garbage" * 8)
    regions = {name: {"half_life": 4.0, "priority": 1.0} for name in ("system", "user", "assistant")}
    calibration = {"model": models.EMBEDDED, "threshold": 1.0, "regions": regions}
    for name, content in (("nancal", {**calibration, "threshold": float("nan")}), ("regioncal", calibration)):
        (tmp / name).mkdir()
        (tmp / name / "calibration.json").write_text(json.dumps(content))


def snapshot(tmp: Path) -> dict:
    return {
        str(path.relative_to(tmp)): hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else None
        for path in sorted(tmp.rglob("*"))
    }


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test here touches the network: the hub is unreachable, LongBench's hub zip absent."""
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setattr(longbench, "hub_data_zip", lambda: None)
    monkeypatch.setattr("kvbench.bridge.models.load_model", fail_if_loaded)


def fail_if_loaded(*args, **kwargs):
    raise AssertionError("a bad input must fail before the model loads")


@pytest.mark.parametrize("args, code, culprit", CASES, ids=[" ".join(case[0])[:80] for case in CASES])
def test_bad_input_is_one_line_naming_the_culprit_and_writes_nothing(args, code, culprit, tmp_path):
    make_files(tmp_path)
    before = snapshot(tmp_path)
    result = CliRunner().invoke(main, [arg.replace("{tmp}", str(tmp_path)) for arg in args])
    assert result.exit_code == code, result.output
    # `kvbench report` prints what it skipped: one summary line per file at most, before the error.
    lines = [line for line in result.output.strip().splitlines() if not line.startswith("Warning: ")]
    skipped = len(result.output.strip().splitlines()) - len(lines)
    assert skipped <= (1 if args[0] == "report" else 0), result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert culprit.replace("{tmp}", str(tmp_path)) in lines[0]
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError)
    assert snapshot(tmp_path) == before  # no --out created, prepared files unchanged byte for byte


@pytest.mark.parametrize("mutation", ["all nan", "one inf", "one -inf"])
@pytest.mark.parametrize(
    "press, folder_arg, weights",
    [("kvp", "agents", "agents.safetensors"), ("distillcache", "weights", "policy.safetensors")]
    + [("gate", "weights", "gates.safetensors")],
)
def test_weights_that_are_not_finite_are_refused_before_the_model_loads(
    press, folder_arg, weights, mutation, tmp_path
):
    """A learned press's shipped state with its weights made nan or inf (a diverged training, a damaged
    file): refused in one line naming the file, before the model loads, nothing written (it scored 0)."""
    import shutil

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    state = tmp_path / "state"
    shutil.copytree(Path(__file__).parents[2] / "presses" / press / "smollm2-135m", state)
    with safe_open(state / weights, framework="pt") as file:
        metadata = file.metadata()
        tensors = {name: file.get_tensor(name) for name in file.keys()}
    name = sorted(name for name, tensor in tensors.items() if tensor.is_floating_point())[-1]
    if mutation == "all nan":
        tensors[name] = torch.full_like(tensors[name], float("nan"))
    else:
        tensors[name] = tensors[name].clone()
        tensors[name].view(-1)[-1] = float("inf") if mutation == "one inf" else float("-inf")
    save_file(tensors, state / weights, metadata=metadata)
    args = [
        *RUN[:2],
        press,
        "--ratio",
        "0.5",
        "--press-arg",
        f"{folder_arg}={state}",
        "--out",
        f"{tmp_path}/out",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith(f"Error: {state / weights}: {name} holds ") and "not finite (nan or inf)" in line
    assert not (tmp_path / "out").exists()


def test_the_table_has_at_least_80_cases():
    assert len(CASES) >= 80 and len({tuple(args) for args, _, _ in CASES}) == len(CASES)


def test_minus_zero_ratio_is_zero():
    ratio = parse_ratio("-0")
    assert ratio == 0.0 and str(ratio) == "0.0"


def test_ctrl_c_during_start_up_is_one_line_exit_130(tmp_path, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("kvbench.bridge.models.load_model", interrupt)
    result = CliRunner().invoke(main, [*RUN, "--task", "niah_single_1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 130 and result.output.strip() == "interrupted"
    assert not (tmp_path / "out").exists()


def short_then_full_disk(monkeypatch, short: int):
    """os.write that writes `short` bytes of the next call, then fails with ENOSPC."""
    calls = []

    def write(fd, data):
        calls.append(data)
        if len(calls) == 1:
            return REAL_WRITE(fd, data[:short])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "write", write)


def row(sample_id: str) -> Row:
    return Row("c", "m", "knorm", 0.5, "t", 1, 0, sample_id, content_hash="h", score=1.0)


def test_a_full_disk_leaves_no_torn_row_and_nothing_counted_done(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path)
    store.append(row("0"))
    before = (tmp_path / "rows.jsonl").read_bytes()
    short_then_full_disk(monkeypatch, short=7)  # a short write, then no space for the rest
    with pytest.raises(ResultsWriteError, match="No space left on device"):
        store.append(row("1"))
    assert (tmp_path / "rows.jsonl").read_bytes() == before
    assert not store.has(row("1")) and store.has(row("0"))
    monkeypatch.undo()
    assert ResultsStore(tmp_path).done == {row("0").key}


def test_a_full_disk_during_a_run_is_one_line_exit_1(tmp_path, monkeypatch, tiny_model_dir):
    from kvbench.harness import runner

    def answers(model, tokenizer, sample, configs, **kwargs):
        return [{"prediction": "x", "context_tokens": 1} for _ in configs]

    monkeypatch.setattr("kvbench.bridge.models.load_model", REAL_LOAD_MODEL)  # a tiny one
    monkeypatch.setattr(runner, "evaluate_sample", answers)
    monkeypatch.setattr(results.ResultsStore, "write_run", lambda self, record, path=None: path)
    short_then_full_disk(monkeypatch, short=5)
    out = tmp_path / "out"
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "niah_single_1", "--length", "512"]
    result = CliRunner().invoke(main, [*args, "--samples", "1", "--model", tiny_model_dir, "--out", str(out)])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert lines[-1] == f"Error: cannot write results to {out / 'rows.jsonl'}: No space left on device"
    assert "Traceback" not in result.output
    assert load_rows(out).empty and (out / "rows.jsonl").read_bytes() == b""


def test_an_lm_eval_task_that_needs_the_hub_is_one_line(tmp_path, monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    from kvbench.harness import lmeval

    def offline(*args, **kwargs):
        raise LocalEntryNotFoundError("cannot reach the hub for dataset 'x'\nand 146 more lines")

    monkeypatch.setattr(lmeval, "KVBenchLM", lambda *args, **kwargs: None)
    monkeypatch.setattr(lmeval, "evaluate", offline)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [*LM_EVAL, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "Error: an lm-eval task needs the Hugging Face hub, which is not reachable: "
        "cannot reach the hub for dataset 'x'"
    )
    assert not out.exists()


# `kvbench presses` whose listing has a bug: kvbench's own errors are one line, anything else is a bug.
BUGGY_LISTING = """
import sys
import kvbench.presses
def listing():
    raise {error}("a bug")
kvbench.presses.list_presses = listing
from kvbench.cli import main
main(["presses"])
"""


@pytest.mark.parametrize("error", ["ZeroDivisionError", "ValueError", "KeyError"])
def test_an_internal_bug_shows_its_traceback_and_exits_1(error):
    """Even a ValueError or KeyError: only kvbench's error types are the user's fault."""
    code = BUGGY_LISTING.format(error=error)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and f"{error}: " in result.stderr
    assert "in listing" in result.stderr  # down to the line that failed


def test_kvbench_errors_keep_their_one_line_from_python_too():
    from kvbench.core.errors import BadInput, KvbenchError

    with pytest.raises(KvbenchError) as info:
        parse_ratio("1.5")
    assert isinstance(info.value, BadInput) and isinstance(info.value, ValueError)
