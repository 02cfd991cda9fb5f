"""ZeroSCROLLS: rows read from the hub's own files (its zip, or the JSONL/Parquet inside), the authors'
prompts split as kvpress splits them and cut as the authors' runners cut them, bad files refused in one
line, and the official metrics against references written here from the definitions of the hub's
`metrics/` files."""

import json
import random
import zipfile

import pyarrow
import pyarrow.parquet
import pytest
from click.testing import CliRunner
from unidecode import unidecode

from kvbench.cli import main
from kvbench.core.errors import DataFileError
from kvbench.tasks import list_tasks, load_samples, score_sample
from kvbench.tasks import zero_scrolls as zs
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.published import HubFile
from kvbench.tasks.zero_scrolls_metrics import SCORERS


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Tests never touch the network: the hub's file is absent."""
    monkeypatch.setattr(HubFile, "local", lambda self: None)


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


INSTRUCTION = (
    "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
    "question as concisely as you can, using a single phrase if possible. Do not provide any explanation."
    "\n\nStory:\n"
)
SEPARATOR = "... [The rest of the story is omitted]\n\n"


def row(index: int, story: str = "", question: str = "Who keeps the lighthouse?", output="Maren", **fields):
    """A row as the hub's validation.jsonl holds it: the whole prompt in `input`, with its indices."""
    story = story or f"Story {index}. Maren keeps the lighthouse on the northern cape."
    head = INSTRUCTION + story
    query = f"Question:\n{question}"
    text = f"{head}\n\n{query}\n\nAnswer:"
    return {
        "id": f"nqa-{index:04d}",
        "pid": f"nqa-{index:04d}_0",
        "input": text,
        "output": output,
        "document_start_index": len(INSTRUCTION),
        "document_end_index": len(head),
        "query_start_index": len(head) + 2,
        "query_end_index": len(head) + 2 + len(query),
        "truncation_seperator": SEPARATOR,
        **fields,
    }


def write_zip(folder, name, validation, test=()) -> None:
    with zipfile.ZipFile(folder / f"{name}.zip", "w") as archive:
        archive.writestr(f"{name}/validation.jsonl", "".join(json.dumps(r) + "\n" for r in validation))
        archive.writestr(f"{name}/test.jsonl", "".join(json.dumps(r) + "\n" for r in test))


def test_loads_the_hubs_zip_with_the_authors_prompt_split_as_kvpress_splits_it(tmp_path, tokenizer):
    second = row(1, output="A keeper named Maren")
    write_zip(tmp_path, "narrative_qa", [row(0), second, row(1)], test=[row(2, output=None)])
    samples = load_samples(
        "zero_scrolls/narrative_qa", length=4000, samples=5, seed=0, tokenizer=tokenizer, data_dir=tmp_path
    )
    assert [s.id for s in samples] == ["nqa-0000", "nqa-0001"]
    first = samples[0]
    assert first.context + first.question + "\n\n" + first.answer_prefix == row(0)["input"]
    assert (
        first.context.endswith("northern cape.")
        and first.question == "\n\nQuestion:\nWho keeps the lighthouse?"
    )
    assert (first.answer_prefix, first.max_new_tokens, first.metric) == ("Answer:", 64, "zero_scrolls_f1")
    assert samples[1].references == ["A keeper named Maren", "Maren"]  # drop_duplicates_in_input
    assert score_sample(samples[1], "maren") == 100.0 and score_sample(first, "nobody") == 0.0


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_reads_the_unpacked_jsonl_or_parquet(suffix, tmp_path, tokenizer):
    rows = [row(0), row(1)]
    (tmp_path / "qasper").mkdir()
    path = tmp_path / "qasper" / f"validation{suffix}"
    if suffix == ".parquet":
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    samples = zs.make_samples("zero_scrolls/qasper", 4000, 5, 0, tokenizer, tmp_path)
    assert [s.id for s in samples] == ["nqa-0000", "nqa-0001"] and samples[0].max_new_tokens == 128


def test_a_long_prompt_is_cut_at_the_documents_end_as_the_authors_cut_it(tmp_path, tokenizer):
    write_zip(tmp_path, "narrative_qa", [row(0, story="Once upon a time. " + "The sea was grey. " * 2000)])
    [sample] = zs.make_samples("zero_scrolls/narrative_qa", 500, 1, 0, tokenizer, tmp_path)
    assert sample.context.startswith(INSTRUCTION + "Once upon a time.") and sample.context.endswith(SEPARATOR)
    assert sample.question == "Question:\nWho keeps the lighthouse?" and sample.answer_prefix == "Answer:"
    assert 490 <= len(tokenizer(sample.context + sample.question, add_special_tokens=False).input_ids) <= 504


@pytest.mark.parametrize(
    ("name", "rows", "message"),
    [
        ("narrative_qa", [{k: v for k, v in row(0).items() if k != "query_end_index"}], "'query_end_index'"),
        ("narrative_qa", [row(0, output=None)], "field 'output': no answer"),
        ("narrative_qa", [row(0, document_end_index=10**6)], "'document_end_index'"),
        ("narrative_qa", [row(0, id=7)], "field 'id'"),
        ("narrative_qa", [row(0), {**row(1), "id": "nqa-0000"}], "another input"),
        ("quality", [row(0, output="the keeper")], "no letter A-D"),
        ("book_sum_sort", [row(0, output="2, 3, 4")], "summary IDs 1..n"),
        (
            "narrative_qa",
            [{"input": "doc", "title": "t", "qa_pairs": "none", "output": "x"}],
            "field",
        ),  # LooGLE
        ("narrative_qa", [], "holds no rows"),
    ],
)
def test_malformed_rows_are_refused_in_one_line_naming_file_and_field(
    name, rows, message, tmp_path, tokenizer
):
    write_zip(tmp_path, name, rows)
    with pytest.raises(DataFileError) as error:
        zs.make_samples(f"zero_scrolls/{name}", 4000, 5, 0, tokenizer, tmp_path)
    text = str(error.value)
    assert "\n" not in text and f"{name}.zip" in text and message in text


def test_a_file_that_is_not_a_zip_is_refused_in_one_line(tmp_path, tokenizer):
    (tmp_path / "musique.zip").write_text("not a zip")
    with pytest.raises(DataFileError, match="musique.zip: not a zip file") as error:
        zs.make_samples("zero_scrolls/musique", 4000, 1, 0, tokenizer, tmp_path)
    assert "\n" not in str(error.value)


def test_the_cli_refuses_a_bad_file_before_any_work_and_writes_nothing(tmp_path):
    write_zip(tmp_path, "gov_report", [row(0, output=None)])
    out = tmp_path / "out"
    args = [
        "run",
        "--press",
        "knorm",
        "--ratio",
        "0.5",
        "--task",
        "zero_scrolls/gov_report",
        "--samples",
        "1",
    ]
    result = CliRunner().invoke(main, [*args, "--data-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "gov_report.zip: row 0: field 'output': no answer" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_without_data_and_hub_the_task_says_so_in_one_line(tmp_path, tokenizer):
    with pytest.raises(TaskUnavailable) as error:
        zs.make_samples("zero_scrolls/qmsum", 4000, 1, 0, tokenizer, tmp_path)
    assert "\n" not in str(error.value) and "tau/zero_scrolls" in str(error.value)
    assert "qmsum/validation.jsonl" in str(error.value)
    with pytest.raises(TaskUnavailable):
        zs.make_samples("zero_scrolls/qmsum", 4000, 1, 0, tokenizer, None)


def test_kvbench_tasks_lists_the_10_tasks_with_their_source():
    listed = [t for t in list_tasks() if t.family == "zero_scrolls"]
    assert len(listed) == 10 and all("hub tau/zero_scrolls or --data-dir" in t.description for t in listed)
    result = CliRunner().invoke(main, ["tasks"])
    assert result.exit_code == 0 and "zero_scrolls/book_sum_sort" in result.output


# ---- the metrics against references written from the definitions, without regular expressions ----

WORD = str.isalnum  # what \w is besides "_"


def is_word(ch: str) -> bool:
    return WORD(ch) or ch == "_"


def ref_drop_articles(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        for article in ("a", "an", "the"):
            end = i + len(article)
            if (
                text.startswith(article, i)
                and (i == 0 or not is_word(text[i - 1]))
                and (end == len(text) or not is_word(text[end]))
            ):
                out.append(" ")
                i = end
                break
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def ref_normalize(text: str) -> list[str]:
    punctuation = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
    kept = "".join(c for c in text.lower() if c not in punctuation)
    return unidecode(" ".join(ref_drop_articles(kept).split())).split()


def ref_f1(prediction, references):
    def one(reference):
        p, r = ref_normalize(prediction), ref_normalize(reference)
        same = sum(min(p.count(t), r.count(t)) for t in set(p))
        if same == 0:
            return 0.0
        precision, recall = same / len(p), same / len(r)
        return 2 * precision * recall / (precision + recall)

    return 100.0 * max(one(reference) for reference in references)


def ref_tokens(text: str) -> list[str]:
    ascii_alnum = set("abcdefghijklmnopqrstuvwxyz0123456789")
    return "".join(c if c in ascii_alnum else " " for c in text.lower()).split()


def ref_fmeasure(overlap, predicted, expected):
    precision, recall = overlap / max(predicted, 1), overlap / max(expected, 1)
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def ref_rouge_n(prediction, reference, n):
    p, r = ref_tokens(prediction), ref_tokens(reference)
    p_grams = [tuple(p[i : i + n]) for i in range(len(p) - n + 1)]
    r_grams = [tuple(r[i : i + n]) for i in range(len(r) - n + 1)]
    overlap = sum(min(p_grams.count(g), r_grams.count(g)) for g in set(r_grams))
    return ref_fmeasure(overlap, len(p_grams), len(r_grams))


def ref_rouge_l(prediction, reference):
    p, r = ref_tokens(prediction), ref_tokens(reference)
    if not p or not r:
        return 0.0
    table = [[0] * (len(p) + 1) for _ in range(len(r) + 1)]
    for i, x in enumerate(r, 1):
        for j, y in enumerate(p, 1):
            table[i][j] = table[i - 1][j - 1] + 1 if x == y else max(table[i - 1][j], table[i][j - 1])
    lcs = table[-1][-1]
    precision, recall = lcs / len(p), lcs / len(r)
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def ref_rouge(prediction, references):
    best = [
        max(fn(prediction, reference) * 100 for reference in references)
        for fn in (lambda a, b: ref_rouge_n(a, b, 1), lambda a, b: ref_rouge_n(a, b, 2), ref_rouge_l)
    ]
    return (best[0] * best[1] * best[2]) ** (1.0 / 3.0)


def ref_letter(text):
    for i, ch in enumerate(text):
        if (
            ch in "ABCD"
            and (i == 0 or not is_word(text[i - 1]))
            and (i + 1 == len(text) or not is_word(text[i + 1]))
        ):
            return ch
    return None


def ref_accuracy(prediction, references):
    return 100.0 * max(ref_letter(prediction) == ref_letter(reference) for reference in references)


def ref_percentage(text):
    """Leftmost digits, then '%' or '.' digits* '%' (the pattern's only matches; digits: Unicode Nd)."""
    for i in range(len(text)):
        j = i
        while j < len(text) and text[j].isdecimal():
            j += 1
        if j == i:
            continue
        if j < len(text) and text[j] == "%":
            return float(text[i:j])
        if j < len(text) and text[j] == ".":
            k = j + 1
            while k < len(text) and text[k].isdecimal():
                k += 1
            if k < len(text) and text[k] == "%":
                return float(text[i:k])
    return None


def ref_exp_similarity(prediction, references):
    def one(reference):
        expected, predicted = ref_percentage(reference) or 0, ref_percentage(prediction)
        return 0.0 if predicted is None else 0.5 ** (abs(expected - predicted) / 10)

    return 100 * max(one(reference) for reference in references)


def ref_ids(text):
    kept = "".join(c if c in "0123456789" or c.isspace() else " " if c == "," else "" for c in text)
    return [int(token) for token in kept.split()]


def ref_concordance(prediction, references):
    def one(reference):
        gold, guess = ref_ids(reference), ref_ids(prediction)
        if sorted(gold) != sorted(guess):
            return 0.0
        where = {summary: position for position, summary in enumerate(guess)}
        sequence = [where[summary] for summary in gold]  # each gold position's ID, placed by the guess
        n = len(sequence)
        concordant = sum(sequence[a] < sequence[b] for a in range(n) for b in range(a + 1, n))
        return concordant / (n * (n - 1) // 2)

    return 100.0 * max(one(reference) for reference in references)


TEXT_PIECES = [
    "the", "The", "THE", "a", "A", "an", "An", "cat", "Cat", "sat", "on", "mat", "dog", "lay", "keeper",
    ".", ",", "'", "-", "_", "!", "\n", "  ", "\t", "é", "Café", "naïve", "ß", "Ⅻ", "ﬁ", "北京", "—", "42",
    "4-2", "x_y", "an.", "the-", "a_", "(A)", "B", "C.", "D:", "Ab", "1C", "ÀB", "keeps", "keeping", "walked",
    "walks", "cats",
]  # fmt: skip
NUMBER_PIECES = [
    "12", "3", "7", ".", "%", "5.5%", "٣", "٣٠%", "1.2.3%", " ", "abc", "100%", "0%", "%%", "7.%", "x", "60",
    "33.3", "\n", "-", "+", "e5",
]  # fmt: skip
ID_PIECES = [
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "10",
    "01",
    ",",
    ", ",
    " ",
    "\n",
    "\u2003",
    "Summary",
    "-",
    ".",
    "١",
]


def draw(rng, pieces, most=12):
    joiner = " " if rng.random() < 0.5 else ""
    return joiner.join(rng.choice(pieces) for _ in range(rng.randint(0, most)))


def near(rng, text, pieces):
    """`text` with a few pieces changed: predictions that overlap their reference."""
    words = text.split(" ")
    for _ in range(rng.randint(0, 3)):
        words[rng.randrange(len(words))] = rng.choice(pieces)
    return " ".join(words)


def cases(metric, rng):
    if metric in ("rouge", "f1"):
        references = [draw(rng, TEXT_PIECES) or "cat" for _ in range(rng.randint(1, 3))]
        prediction = (
            near(rng, rng.choice(references), TEXT_PIECES) if rng.random() < 0.5 else draw(rng, TEXT_PIECES)
        )
        return prediction, references
    if metric == "accuracy":
        references = [rng.choice(["(A) a keeper", "B", "(C)", "D) the end", "Answer: (B) two"])]
        return draw(rng, TEXT_PIECES, 6), references
    if metric == "exp_similarity":
        references = [rng.choice(["60%", "33.3%", "no percentage", "12.5% of them", "٣٠%"])]
        return draw(rng, NUMBER_PIECES, 6), references
    n = rng.randint(2, 6)
    gold = rng.sample(range(1, n + 1), n)
    references = [rng.choice([", ", " ", ",", "\n"]).join(map(str, gold))]
    if rng.random() < 0.6:
        guess = rng.sample(range(1, n + 1), n)
        return rng.choice([", ", " ", "-", " , "]).join(map(str, guess)), references
    return draw(rng, ID_PIECES), references


REFERENCES = {
    "rouge": ref_rouge,
    "f1": ref_f1,
    "accuracy": ref_accuracy,
    "exp_similarity": ref_exp_similarity,
    "concordance_index": ref_concordance,
}
ADVERSARIAL = {
    "rouge": [("", ["the cat"]), ("...", ["the cat"]), ("Café", ["caf"]), ("the cat", ["the cat", ""])],
    "f1": [("", ["the"]), ("The Café!", ["the cafe"]), ("a an the", ["the"]), ("北京", ["Bei Jing"])],
    "accuracy": [("", ["(A)"]), ("A", ["(A)"]), ("éA", ["A"]), ("_A", ["A"]), ("A_ B", ["B"]), ("AB", ["A"])],
    "exp_similarity": [("", ["60%"]), ("60 %", ["60%"]), ("٣٠%", ["30%"]), ("7.%", ["7%"]), ("5%", ["none"])],
    "concordance_index": [("", ["1 2"]), ("2 1", ["1, 2"]), ("2-1 3", ["1, 2, 3"]), ("١ 2 1", ["2, 1"])],
}


@pytest.mark.parametrize("metric", sorted(REFERENCES))
def test_each_metric_matches_its_reference_on_random_and_adversarial_cases(metric):
    rng = random.Random(f"zero-scrolls-{metric}")
    drawn = ADVERSARIAL[metric] + [cases(metric, rng) for _ in range(5000)]
    mismatches = []
    for prediction, references in drawn:
        got, expected = SCORERS[metric](prediction, references), REFERENCES[metric](prediction, references)
        if got != pytest.approx(expected, rel=1e-12, abs=1e-12):
            mismatches.append((prediction, references, got, expected))
    assert mismatches[:5] == []
    outcomes = [REFERENCES[metric](p, r) for p, r in drawn]
    assert len({round(x, 6) for x in outcomes}) >= (2 if metric == "accuracy" else 3)  # not one outcome only


def test_a_sample_is_scored_by_its_tasks_official_metric():
    sample = Sample(
        "zero_scrolls/book_sum_sort", "x", "", "", "", ["2, 1, 3"], 256, "zero_scrolls_concordance_index"
    )
    assert score_sample(sample, "2, 1, 3") == 100.0 and score_sample(sample, "1, 2, 3") == pytest.approx(
        200 / 3
    )
    assert score_sample(sample, "2, 1") == 0.0
