"""lm-eval data and scoring for kvbench's RULER tasks: the samples are kvbench's own (kvbench.tasks).

Each doc is one kvbench sample: `prompt` is context + question, and `kvbench_question` tells the kvbench
model where the question starts, so it compresses the context only, exactly as `kvbench run` does. Other
models just read the prompt. With the chat template applied (`kvbench lm-eval` does it whenever the
tokenizer has one), the prompt and answer prefix are token for token those of `kvbench run`.
"""

import json
from dataclasses import asdict

import datasets

from kvbench import tasks
from kvbench.bridge.models import load_tokenizer
from kvbench.harness.lmeval import QUESTION_FIELD
from kvbench.tasks.base import Sample


def load_dataset(task, max_seq_lengths=(4096,), samples=500, seed=0, data_dir=None, **metadata):
    """Docs of kvbench task `task` at each length. lm-eval passes the model arguments and `--metadata` here:
    the tokenizer is `tokenizer` (a name or folder) or else the model's `pretrained` name."""
    name = metadata.get("tokenizer") or metadata.get("pretrained")
    if not name:
        raise ValueError(f"kvbench_{task} sizes its samples with a tokenizer: pass metadata tokenizer=NAME")
    tokenizer = load_tokenizer(name)
    docs = [
        {
            "prompt": sample.context + sample.question,
            QUESTION_FIELD: sample.question,
            "answer_prefix": sample.answer_prefix,
            "references": sample.references,
            "max_length": length,
            "seed": seed,
            "sample_id": sample.id,
            "sample": json.dumps(asdict(sample)),
        }
        for length in max_seq_lengths
        for sample in tasks.load_samples(
            task, length=length, samples=samples, seed=seed, tokenizer=tokenizer, data_dir=data_dir
        )
    ]
    return {"test": datasets.Dataset.from_list(docs)}


def process_results(doc, results):
    """kvbench's metric for the sample, on lm-eval's 0-1 scale."""
    sample = Sample(**json.loads(doc["sample"]))
    return {"score": tasks.score_sample(sample, results[0]) / 100}
