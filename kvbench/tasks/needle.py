"""Needle in a haystack on Paul Graham's essays: one sentence (the needle) put at a depth of the essays cut to
a length, over a grid of depths x lengths, placed as gkamradt/LLMTest_NeedleInAHaystack places it, asked and
scored as kvpress's evaluation (benchmarks/needle_in_haystack) asks and scores it.

Grid: for a run's `length` L, the lengths round(L * k / 4) for k = 4, 3, 2, 1 (gkamradt's evenly spaced
context lengths, up to L) and at each the depths 0, 10, ..., 100 % (gkamradt's linear depth percents): 44
cells, the longest length first, of which the `samples` first are asked (`--samples 11`: every depth at L).

Placement (gkamradt's `insert_needle`): the haystack, repeated whole while it is too short, is cut to the
tokens a cell leaves once the prompt and the needle are counted; the needle's tokens go in at
int(n * depth / 100) tokens, moved back to just after the last "." token before that point (so the needle
starts a sentence; none before it: at the start); at depth 100 the needle ends the haystack. A "." token is
one that decodes to "." (gkamradt encodes "." with tiktoken, where that is the one token; a SentencePiece
tokenizer's "." in running text is another token than its encoding of ".").

Prompt: kvpress's: the context `This is a very long story book: <book> {haystack} </book>.`, then the
dataset's question and answer prefix, with the chat template; a cell's length counts the tokens of context and
question, as LongBench's lengths do.

Metric `needle_rouge`: kvpress's calculate_metrics, ROUGE of the `rouge` package between the needle and the
prediction, both stripped and the needle passed as the hypothesis as kvpress passes it; its ROUGE-L F x 100.
An empty prediction, where the package raises, scores 0.

Data: `--data-dir/paul_graham_essays.parquet` (or `.jsonl`, `.json`): kvpress's dataset
alessiodevoto/paul_graham_essays (fields context, the essays; needle; question; answer_prefix;
max_new_tokens; its first row is used, as kvpress's `insert_needle_in_haystack` uses it); or
`--data-dir/PaulGrahamEssays/*.txt`, gkamradt's essay files, read in name order, with gkamradt's needle and
question, no answer prefix and 64 new tokens; else the hub's dataset (the file `push_to_hub` writes for its
test split). Without a haystack the task says so in one line.
"""

from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import BadInput, DataFileError, UnknownTask
from kvbench.core.validation import STRICT
from kvbench.tasks import kvpress
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family, check_request, published_api
from kvbench.tasks.published import HubFile, checked_rows, find_rows

HUB = HubFile("alessiodevoto/paul_graham_essays", "data/test-00000-of-00001.parquet")
ESSAYS = "PaulGrahamEssays"  # gkamradt's folder of essay files
TASK = "needle_in_haystack"
MIN_LENGTH = 512  # the shortest cell (a quarter of it) still holds the prompt, the needle and some haystack
LENGTH_STEPS = 4
DEPTHS = tuple(range(0, 101, 10))
WRAPPER = "This is a very long story book: <book> {context} </book>."  # kvpress's context_wrapper
# gkamradt's run.py defaults, for his essay files.
GKAMRADT_NEEDLE = (
    "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
)
GKAMRADT_QUESTION = "What is the best thing to do in San Francisco?"
GKAMRADT_MAX_NEW_TOKENS = 64  # room for the needle's 20-odd tokens

SOURCE = f"hub {HUB.repo} or --data-dir"
TASKS = {
    TASK: f"needle in Paul Graham's essays: {len(DEPTHS)} depths x {LENGTH_STEPS} lengths up to --length, "
    f"ROUGE-L against the needle ({SOURCE})"
}


@dataclass
class HaystackRow:
    """The schema of a row of kvpress's needle dataset: the haystack and what is hidden and asked in it."""

    __pydantic_config__ = STRICT

    context: str
    needle: str
    question: str
    answer_prefix: str
    max_new_tokens: int


def needle_rouge(prediction: str, sample: Sample) -> float:
    """kvpress's score of a needle: `Rouge().get_scores(needle.strip(), prediction.strip())`, its ROUGE-L F
    x 100; 0 where the package raises (an empty prediction, or a sentence so long its recursive LCS
    overflows)."""
    from rouge import Rouge

    try:
        scores = Rouge(metrics=["rouge-l"]).get_scores(sample.references[0].strip(), prediction.strip())
    except (ValueError, RecursionError):
        return 0.0
    return 100.0 * scores[0]["rouge-l"]["f"]


METRICS = {"needle_rouge": needle_rouge}


min_length, reads_data_dir = published_api(MIN_LENGTH)


def local_files(data_dir: Path | None) -> list[Path]:
    suffixes = (".parquet", ".jsonl", ".json")
    return [] if data_dir is None else [Path(data_dir) / f"paul_graham_essays{s}" for s in suffixes]


def essay_files(data_dir: Path | None) -> list[Path] | None:
    """gkamradt's essay files in --data-dir, in name order; None when the folder is not there."""
    folder = None if data_dir is None else Path(data_dir) / ESSAYS
    if folder is None or not folder.is_dir():
        return None
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise DataFileError(f"{folder}: holds no .txt essays")
    return files


def read_essays(files: list[Path]) -> HaystackRow:
    """gkamradt's haystack (the files' text joined, as his `read_context_files` joins it) with his needle."""
    texts = []
    for path in files:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise DataFileError(f"{path}: not UTF-8 text") from None
    return HaystackRow("".join(texts), GKAMRADT_NEEDLE, GKAMRADT_QUESTION, "", GKAMRADT_MAX_NEW_TOKENS)


def read_haystack(data_dir: Path | None) -> HaystackRow:
    """The haystack, needle and question: gkamradt's files in data_dir, else kvpress's dataset from data_dir,
    else from the hub (its first row; every row checked); TaskUnavailable in one line naming every place
    looked at when none is there."""
    files = essay_files(data_dir)
    if files is not None:
        row, source = read_essays(files), str(files[0].parent)
    else:
        folder = [] if data_dir is None else [Path(data_dir) / ESSAYS]  # named in the message if missing
        rows, source = find_rows([*folder, *local_files(data_dir)], HUB, "the needle's haystack")
        row = checked_rows(rows, HaystackRow, source)[0]
    for field in ("context", "needle", "question"):
        if not getattr(row, field).strip():
            raise DataFileError(f"{source}: field {field!r}: empty")
    if row.max_new_tokens < 1:
        raise DataFileError(f"{source}: field 'max_new_tokens': {row.max_new_tokens}, not a positive number")
    return row


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local haystack now, so a malformed one fails before any model loads."""
    if essay_files(data_dir) is not None or any(path.is_file() for path in local_files(data_dir)):
        read_haystack(data_dir)


def grid(length: int) -> list[tuple[int, int]]:
    """The (length, depth) cells for a run's `length`, in the order they are asked: longest first."""
    lengths = [round(length * k / LENGTH_STEPS) for k in range(LENGTH_STEPS, 0, -1)]
    return [(cell, depth) for cell in lengths for depth in DEPTHS]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def haystack_tokens(tokenizer, text: str, count: int) -> list[int]:
    """The first `count` tokens of `text`, appended to itself whole while it is too short (gkamradt's
    `read_context_files` reads the essays again until they are long enough)."""
    repeated = text
    tokens = encode(tokenizer, repeated)
    while len(tokens) < count:
        repeated += text
        tokens = encode(tokenizer, repeated)
    return tokens[:count]


def insert_needle(tokens: list[int], needle: list[int], depth: int, periods: set[int]) -> list[int]:
    """gkamradt's placement: `needle` after `tokens` at depth 100, else at int(len * depth / 100) moved back
    to just after the last token of `periods` before it (to the start if there is none)."""
    if depth == 100:
        return tokens + needle
    point = int(len(tokens) * depth / 100)
    while point > 0 and tokens[point - 1] not in periods:
        point -= 1
    return tokens[:point] + needle + tokens[point:]


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """The first `samples` cells of the grid (`grid`); ids "<length>-<depth>", meta {"length", "depth"}.
    `seed` plays no part: the haystack and the placement are fixed."""
    if task not in TASKS:
        raise UnknownTask(f"unknown needle task {task!r} (see `kvbench tasks`)")
    check_request(task, length, samples, MIN_LENGTH)
    row = read_haystack(data_dir)
    cells = grid(length)[:samples]
    needle = encode(tokenizer, row.needle)
    prompt = len(encode(tokenizer, WRAPPER.format(context="") + row.question)) + len(needle)
    tokens = haystack_tokens(tokenizer, row.context, max(cell for cell, _ in cells) - prompt)
    periods = {token for token in set(tokens) if tokenizer.decode([token]).strip() == "."}
    result = []
    for cell, depth in cells:
        room = cell - prompt
        if room < 1:
            raise BadInput(
                f"{task}: a {cell}-token cell leaves no room for the haystack; give a larger --length"
            )
        text = tokenizer.decode(
            insert_needle(tokens[:room], needle, depth, periods), skip_special_tokens=True
        )
        result.append(
            Sample(
                task=task,
                id=f"{cell}-{depth}",
                context=WRAPPER.format(context=text),
                question=row.question,
                answer_prefix=row.answer_prefix,
                references=[row.needle],
                max_new_tokens=row.max_new_tokens,
                metric="needle_rouge",
                meta={"length": cell, "depth": depth},
            )
        )
    return result


# ---- kvpress's evaluation ----


class KvpressNeedle(kvpress.Dataset):
    """`needle_in_haystack` (`benchmarks/needle_in_haystack/`, its `utils.py`): metrics.json a list, one
    `Rouge().get_scores(needle, prediction)[0]` per row (`rouge-1`, `rouge-2`, `rouge-l`, each `r`, `p`,
    `f`); no data_dir, `max_context_length` and `needle_depth` set; columns `needle`, `needle_depth`,
    `question`, `answer_prefix`, `max_new_tokens`. kvbench's `needle_in_haystack` cell of length C and
    depth D is a folder with max_context_length C and needle_depth D (a run at length L comes back as its
    cells' lengths). kvpress puts the needle at the token of the depth in `max_context_length - 150 -
    needle` tokens of essays, kvbench after the sentence before it in a cell's length less the prompt
    (gkamradt's): the same grid, not the same contexts."""

    name = exports = TASK
    columns = ("needle", "needle_depth", "question", "answer_prefix", "max_new_tokens")
    answer = "needle"
    reads = ("needle_depth",)
    schema = list[dict[str, dict[str, float]]]

    def target(self, row):
        if row["task"] != TASK:
            return None
        meta = row["meta"] or {}
        return kvpress.Target(self.name, "", self.name, meta.get("length", row["length"]), meta.get("depth"))

    def cells(self, row):
        return {"needle": row["references"][0], "needle_depth": (row["meta"] or {}).get("depth", "")}

    def metrics(self, rows):
        return [rouge_scores(row["references"][0], row["prediction"] or "") for row in rows]

    def check_config(self, config, path):
        if config.max_context_length is None:
            raise DataFileError(f"{path}: field 'max_context_length': missing (needle_in_haystack sets it)")

    def check_metrics(self, metrics, path):
        for index, scores in enumerate(metrics):
            if "f" not in scores.get("rouge-l", {}):
                raise DataFileError(f"{path}: field '{index}.rouge-l.f': missing")

    def task(self, config, line):
        return self.name

    def sample(self, task, line, config, where):
        meta = {
            "length": config.max_context_length,
            "depth": kvpress.whole(line["needle_depth"], "needle_depth", where),
        }
        return kvpress.scored(task, [kvpress.text_of(line, self.answer, where)], "needle_rouge", meta)

    def sample_id(self, task, line, index, config):
        return f"{config.max_context_length}-{int(line['needle_depth'])}"

    def figures(self, metrics):
        return {
            "rouge-l": 100 * kvpress.mean([scores["rouge-l"]["f"] for scores in metrics]) if metrics else None
        }

    def label(self, row):
        return "rouge-l"


def rouge_scores(needle_text: str, prediction: str) -> dict:
    """calculate_metrics' entry of one row: `Rouge().get_scores(needle, prediction)[0]`, stripped; zeros where
    the package raises (an empty prediction: kvpress's scorer would raise there)."""
    from rouge import Rouge

    try:
        return Rouge().get_scores(needle_text.strip(), prediction.strip())[0]
    except (ValueError, RecursionError):
        return {name: {"r": 0.0, "p": 0.0, "f": 0.0} for name in ("rouge-1", "rouge-2", "rouge-l")}


FAMILY = Family(
    "needle_in_haystack", kinds={task: "needle-in-a-haystack" for task in TASKS}, kvpress=(KvpressNeedle(),)
)
