"""Request traces for the prefix-cache benchmark: made from kvbench's own material, seeded, written and read
as JSONL so that a trace is an artefact others can replay.

A trace file holds two kinds of line (`kind`): `chunk` lines (`id`, `text`), the pieces prompts are made of,
and `request` lines (`id`, `session`, `chunks`: chunk ids in prompt order, `question`). A prompt is its
chunks' texts in order, then the question. Both families of request become this one shape:

- RAG requests: k of n document chunks (sentences of the stdlib essay the agent tasks search), drawn by a
  Zipf popularity and put in a random order, then a question about them;
- multi-turn sessions (the agent-trace generator's conversations): a system prompt shared by every session
  of the same agent, then the session's turns so far, one chunk per turn; turn t's request holds the system
  prompt and turns 1..t, so the history grows as the session goes on. Sessions interleave (or not) with the
  RAG requests in arrival order.
"""

import dataclasses
import json
import random
from pathlib import Path

from kvbench.core.errors import BadInput, DataFileError
from kvbench.core.validation import jsonl_lines, parse_count, parse_int, parse_json, read_text


@dataclasses.dataclass(frozen=True)
class Request:
    id: str
    session: str
    chunks: tuple[str, ...]
    question: str


@dataclasses.dataclass(frozen=True)
class Trace:
    chunks: dict[str, str]  # chunk id -> text
    requests: list[Request]

    def prompt_chunks(self, request: Request) -> list[str]:
        return [self.chunks[name] for name in request.chunks]


QUESTIONS = (
    "Which sentence above mentions the most people?",
    "Summarise the passages above in one line.",
    "What is the main claim of the second passage?",
    "Name one word that the passages above share.",
)


def zipf_weights(n: int, exponent: float) -> list[float]:
    return [1.0 / (rank + 1) ** exponent for rank in range(n)]


def make_trace(
    requests: int = 60,
    seed: int = 0,
    docs: int = 12,
    k: int = 3,
    zipf: float = 1.1,
    sessions: int = 4,
    agents: int = 2,
    session_share: float = 0.4,
    chunk_chars: int = 200,
    interleave: bool = True,
) -> Trace:
    """A seeded trace of `requests` requests: a `session_share` of them are turns of `sessions` multi-turn
    sessions (of `agents` agents, each with its system prompt), the rest RAG requests over `docs` chunks of
    about `chunk_chars` characters, `k` per request, drawn with Zipf(`zipf`) popularity."""
    from kvbench.tasks import agent

    requests = parse_count(requests, "requests")  # counts of what is made one by one: bounded, so that a
    docs, k = parse_count(docs, "docs"), parse_int(k, "k", 1)  # digit too many fails now, not in an hour
    if k > docs:
        raise BadInput(f"k must be at most docs ({docs}), got {k}")
    sessions, agents = parse_count(sessions, "sessions", 0), parse_count(agents, "agents")
    rng = random.Random(seed)
    sentences = agent.snippet_sentences()
    chunks: dict[str, str] = {}
    for d in range(docs):
        text, start = "", rng.randrange(len(sentences))
        while len(text) < chunk_chars:
            text += sentences[(start + len(text)) % len(sentences)] + " "
        chunks[f"doc{d}"] = f"Passage {d}: {text.strip()}\n"
    weights = zipf_weights(docs, zipf)
    n_session = round(requests * session_share) if sessions else 0
    rag = []
    for i in range(requests - n_session):
        picked: list[int] = []
        while len(picked) < k:
            choice = rng.choices(range(docs), weights)[0]
            if choice not in picked:
                picked.append(choice)
        rag.append(Request(f"rag{i}", "", tuple(f"doc{d}" for d in picked), rng.choice(QUESTIONS)))
    queues: list[list[Request]] = []
    for s in range(sessions):
        system = f"agent{s % agents}/system"
        prompt = agent.trace("agent_tool_value", f"serving/agent{s % agents}", 8).messages[0]["content"]
        chunks.setdefault(system, f"system: {prompt[: chunk_chars * 2]}\n")
        path, queue = [system], []
        for t, message in enumerate(agent.trace("agent_tool_value", f"serving/session{s}", 8).messages[1:]):
            chunks[f"session{s}/turn{t}"] = f"{message['role']}: {message['content'][:chunk_chars]}\n"
            path.append(f"session{s}/turn{t}")
            if t % 2 == 0:  # a request after each user or tool turn: the history so far
                queue.append(Request(f"session{s}/req{t // 2}", f"session{s}", tuple(path), "What next?"))
        queues.append(queue)
    picked: list[list[Request]] = [[] for _ in queues]
    for i in range(n_session):  # round-robin over the sessions, each in its own order
        live = [q for q in range(len(queues)) if len(picked[q]) < len(queues[q])]
        if not live:
            break
        q = live[i % len(live)]
        picked[q].append(queues[q][len(picked[q])])
    if not interleave:
        return Trace(chunks, rag + [r for queue in picked for r in queue])
    # arrival order: every session's turns in order, sessions and RAG requests merged at random
    order: list[Request] = []
    pending = [list(q) for q in picked if q] + ([list(rag)] if rag else [])
    while pending:
        queue = rng.choices(pending, [len(q) for q in pending])[0]
        order.append(queue.pop(0))
        pending = [q for q in pending if q]
    return Trace(chunks, order)


def write_trace(trace: Trace, path: Path) -> None:
    lines = [json.dumps({"kind": "chunk", "id": name, "text": text}) for name, text in trace.chunks.items()]
    lines += [
        json.dumps({"kind": "request", **dataclasses.asdict(r), "chunks": list(r.chunks)})
        for r in trace.requests
    ]
    path.write_text("\n".join(lines) + "\n")


def read_trace(path: Path) -> Trace:
    """A trace file, every line checked; DataFileError (one line: file, line, what) if it is malformed, empty,
    or a request names a chunk the file does not define."""
    try:
        text = read_text(path, DataFileError)  # a FIFO is refused, not waited on
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: cannot read the trace ({error.__class__.__name__})") from None
    chunks: dict[str, str] = {}
    requests: list[Request] = []
    for number, line in enumerate(jsonl_lines(text), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = parse_json(line)
        except ValueError as error:
            raise DataFileError(f"{where}: not a JSON line ({str(error).splitlines()[0]})") from None
        if not isinstance(row, dict) or row.get("kind") not in ("chunk", "request"):
            raise DataFileError(f"{where}: each line must be an object with kind 'chunk' or 'request'")
        if row["kind"] == "chunk":
            if not isinstance(row.get("id"), str) or not isinstance(row.get("text"), str) or not row["text"]:
                raise DataFileError(f"{where}: a chunk needs a string id and a non-empty string text")
            if row["id"] in chunks:
                raise DataFileError(f"{where}: chunk {row['id']!r} defined twice")
            chunks[row["id"]] = row["text"]
            continue
        names = row.get("chunks")
        fields_ok = all(isinstance(row.get(f), str) for f in ("id", "session", "question"))
        if (
            not fields_ok
            or not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) for n in names)
        ):
            raise DataFileError(
                f"{where}: a request needs string id, session and question and a non-empty list of chunk ids"
            )
        unknown = [n for n in names if n not in chunks]
        if unknown:
            raise DataFileError(f"{where}: request {row['id']!r} names unknown chunk {unknown[0]!r}")
        requests.append(Request(row["id"], row["session"], tuple(names), row["question"]))
    if not requests:
        raise DataFileError(f"{path}: the trace holds no requests")
    return Trace(chunks, requests)
