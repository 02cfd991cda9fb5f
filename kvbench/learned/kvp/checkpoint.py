"""KVP agents on disk: `agents.safetensors` (weights + normalisation, stacked over heads) and `card.json`.

The card says which model the agents were made for (name and attention shape), which heads the stack holds,
the architecture (`agent.arch`: compact or apple; cards from before there were two are compact), the
feature and training config, a summary of the data and the validation reward per head.
"""

from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file

from kvbench.core.errors import KVPAgentsError
from kvbench.core.validation import STRICT, Count, check_json, parse_json, read_bytes
from kvbench.learned.common import (  # noqa: F401 (ModelShape and model_shape are part of this module's API)
    CARD_FILE,
    ModelShape,
    TrainingFileError,
    check_finite,
    check_fits,
    model_shape,
    save_learned_state,
    shipped_state_dir,
)
from kvbench.learned.common import train_command_hint as training_hint
from kvbench.learned.kvp.agent import ARCHS, StackedAgents

WEIGHTS_FILE = "agents.safetensors"
METHOD = "kvp"


def default_agents_dir(name: str) -> Path:
    """Where the shipped agents of model `name` live: presses/kvp/<name>/ (kvbench.core.resources)."""
    return shipped_state_dir(METHOD, name)


def train_command_hint(name: str) -> str:
    return training_hint(METHOD, name, "agents")


def save_agents(directory: Path, agents: StackedAgents, card: dict) -> None:
    """Weights and card in the learned presses' one format; the weights say what they are, card or not."""
    card = {"method": METHOD, **card, "agent": agents.describe()}
    save_learned_state(directory, WEIGHTS_FILE, agents, card, metadata={"arch": agents.arch})


@dataclass
class Card:
    """The schema of the fields of a KVP card that kvbench reads: the model it was made for, the heads of
    the stack (flat indices, layer-major) and the validation reward per head of each ranker. Other fields
    (training, data, agent, ...) are records and pass as they are."""

    __pydantic_config__ = STRICT

    model: ModelShape
    heads: list[Count]
    validation: dict[str, list[float]] = field(default_factory=dict)


def load_card(directory: Path) -> dict:
    """A KVP card checked against `Card`; a missing, corrupt or misshapen one is a one-line KVPAgentsError."""
    path = Path(directory) / CARD_FILE
    if not path.is_file():
        raise KVPAgentsError(f"no KVP agents at {directory} (missing {CARD_FILE})")
    try:
        text = read_bytes(path, ValueError)
        card = parse_json(text)  # first: JSON nested too deep is refused as such
        check_json(Card, text, "", ValueError)
    except ValueError as error:  # UnicodeDecodeError is one
        raise KVPAgentsError(f"{path}: not a KVP agents card ({str(error).splitlines()[0]})") from None
    validation = card.get("validation", {})
    if any(len(rewards) != len(card["heads"]) for rewards in validation.values()):
        raise KVPAgentsError(f"{path}: not a KVP agents card (a validation list is not one reward per head)")
    return card


def card_arch(card: dict) -> str:
    """The architecture a card records; cards written before there were two are compact."""
    agent = card.get("agent")
    return agent.get("arch", "compact") if isinstance(agent, dict) else "compact"


def card_utility(card: dict) -> str:
    """The target a card's agents were trained on; cards written before there were several: future."""
    training = card.get("training")
    return training.get("utility", "future") if isinstance(training, dict) else "future"


def load_agents(directory: Path, arch: str | None = None) -> tuple[StackedAgents, dict]:
    """The agents in `directory` and their card; `arch`, when given, is the architecture the caller expects
    (refused if the card records another)."""
    directory = Path(directory)
    card = load_card(directory)
    made = card_arch(card)
    check_arch(made, arch, directory)
    path = directory / WEIGHTS_FILE
    try:
        with safe_open(path, framework="pt") as weights:
            weights_arch = (weights.metadata() or {}).get("arch", made)  # files from before: as the card says
        if weights_arch != made:
            raise KVPAgentsError(f"{path} holds {weights_arch} agents but {CARD_FILE} says {made}")
        state = check_finite(load_file(path), path, train_command_hint(card["model"]["name"]), KVPAgentsError)
        agents = ARCHS[made].from_state(state)
        agents.load_state_dict(state)
    except KVPAgentsError:
        raise
    except Exception as error:  # safetensors' own error type, OSError, a missing or misshapen tensor
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise KVPAgentsError(f"{path}: unreadable {made} KVP agents ({message})") from None
    return agents, card


def check_arch(made: str, expected: str | None, directory: Path) -> None:
    """Refuse a card of an unknown architecture, or of another one than `expected` (None: any)."""
    if made not in ARCHS:
        raise KVPAgentsError(
            f"{directory / CARD_FILE}: unknown KVP arch {made!r} (this kvbench knows {', '.join(ARCHS)})"
        )
    if expected is not None and expected != made:
        raise KVPAgentsError(f"KVP agents at {directory} are {made} agents, not {expected}")


def check_agents_fit(card: dict, shape: ModelShape, directory: Path) -> None:
    """Refuse agents made for another model or covering only part of its heads."""
    try:
        check_fits(card, shape, directory, "KVP agents", train_command_hint(shape.name))
    except TrainingFileError as error:
        raise KVPAgentsError(str(error)) from None
    if sorted(card["heads"]) != list(range(shape.num_heads)):
        raise KVPAgentsError(
            f"KVP agents at {directory} cover {len(card['heads'])} of the model's {shape.num_heads} heads; "
            "train all heads (omit --layers/--heads) to use them as a press"
        )


def validation_table(card: dict):
    """Per-head validation normalised cost (1 = oracle; lower is better) of the agents and the references."""
    import pandas as pd

    num_kv_heads = card["model"]["num_kv_heads"]
    table = pd.DataFrame({name: [-r for r in rewards] for name, rewards in card["validation"].items()})
    table.insert(0, "layer", [head // num_kv_heads for head in card["heads"]])
    table.insert(1, "kv_head", [head % num_kv_heads for head in card["heads"]])
    return table


def plot_validation(card: dict, path: Path) -> None:
    """Validation normalised cost per layer (mean over KV heads): agents vs oracle, random, knorm, recency."""
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    table = validation_table(card).drop(columns="kv_head")
    long = table.melt(id_vars="layer", var_name="ranking", value_name="normalised cost")
    grid = sns.relplot(data=long, x="layer", y="normalised cost", hue="ranking", kind="line", marker="o")
    grid.set(
        yscale="log",
        title=f"KVP {card_arch(card)} agents of {card['model']['name']}: validation cost (1 = oracle)",
    )
    grid.savefig(path, dpi=120)
