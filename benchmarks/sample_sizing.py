"""Sample generation of a suite, whose sizing counts each candidate prompt's tokens: with
`prompt.input_token_count` (the texts encoded, no regions or tensors) against the full `tokenize_sample`
it replaced, on the embedded model's tokenizer as transformers reads it and as a held rerun reads it
(`TokenizerFiles`).

    uv run python benchmarks/sample_sizing.py [--suite heldout] [--repeats 3]

Seconds to make the suite's samples, fastest of interleaved repeats (`TokenizerFiles`'s memo of encodings
emptied before each, as a new process finds it), and the ratio; the samples are checked identical first.
"""

import argparse
import time

from kvbench.bridge.models import TokenizerFiles, load_tokenizer
from kvbench.tasks import generated, load_samples, load_suite
from kvbench.tasks.prompt import tokenize_sample


def fed_tokens(tokenizer, sample) -> int:
    prompt = tokenize_sample(tokenizer, sample)
    return prompt.context_ids.shape[1] + prompt.question_ids.shape[1]


def suite_samples(suite, tokenizer, count) -> list:
    generated.input_token_count = count
    return [
        load_samples(task, length=suite.length, samples=suite.samples, seed=0, tokenizer=tokenizer)
        for task in suite.tasks
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suite", default="heldout")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    suite = load_suite(args.suite)
    counts = {"tokenize_sample": fed_tokens, "input_token_count": generated.input_token_count}
    for reader, tokenizer in (
        ("transformers", load_tokenizer()),
        ("TokenizerFiles", TokenizerFiles.open("smollm2-135m")),
    ):
        made = {name: suite_samples(suite, tokenizer, count) for name, count in counts.items()}
        assert made["tokenize_sample"] == made["input_token_count"]
        best = {name: float("inf") for name in counts}
        for _ in range(args.repeats):
            for name, count in counts.items():
                getattr(tokenizer, "encodings", {}).clear()  # as a new process finds it
                started = time.perf_counter()
                suite_samples(suite, tokenizer, count)
                best[name] = min(best[name], time.perf_counter() - started)
        ratio = best["tokenize_sample"] / best["input_token_count"]
        print(
            f"{args.suite} ({len(suite.tasks)} tasks x {suite.samples} samples at {suite.length}), {reader}: "
            + ", ".join(f"{name} {value:.2f} s" for name, value in best.items())
            + f"; {ratio:.2f}x"
        )


if __name__ == "__main__":
    main()
